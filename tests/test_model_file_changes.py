"""A model file changed on disk under a running server (issue 33 item 11).

`cp new.gguf model.gguf` truncates the file in place before it writes: a server reading the weights
through mmap then died with SIGBUS on its next step, every client cut off. Weights are now read
into memory (llama.cpp's load_mode NONE: llamacpp_native.read_into_memory), and the server notices
the file's size/mtime/inode/ctime changing before the next job (serve/catalogue.py, and the digest's
stamp), so it re-reads the model, or refuses a broken one by name, instead of crashing. Without the
fix the streaming request below ends "peer closed connection" and the server exits -7 (SIGBUS).
"""

from __future__ import annotations

import importlib.util
import shutil

import httpx
import pytest

from tests.serve_helpers import Server, models_toml, server_env

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")

CHAT = "/v1/chat/completions"


def _ask(server: Server) -> httpx.Response:
    body = {"model": "copy-gguf", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    return httpx.post(server.url + CHAT, json=body, timeout=60)


def test_truncating_a_loaded_gguf_does_not_crash_the_server(tmp_path, tiny_dir, session_cache):
    from tests.tiny.gguf_llama import build

    original = build(tiny_dir)
    model = tmp_path / "copy.gguf"
    shutil.copyfile(original, model)
    toml = models_toml({"copy-gguf": {"local": str(model)}}, tmp_path)
    server = Server(tmp_path, server_env(tmp_path, session_cache, toml))
    try:
        server.wait_healthy()
        first = _ask(server)
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]

        size = model.stat().st_size
        # truncated in place while a long answer streams: what `cp new.gguf model.gguf` does first
        body = {"model": "copy-gguf", "prompt": "Once", "max_tokens": 3000, "temperature": 0, "stream": True}
        chunks = 0
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                chunks += line.startswith("data: ")
                if chunks == 3:
                    with open(model, "r+b") as f:
                        f.truncate(size // 2)  # the header stays readable, the tensors do not
        assert chunks > 3
        assert server.proc.poll() is None, f"the server died ({server.proc.returncode}):\n{server.log()}"
        second = _ask(server)
        assert server.proc.poll() is None, f"the server died ({server.proc.returncode}):\n{server.log()}"
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        # the truncated file is noticed and refused by name, not run as if it were the old one
        assert second.status_code >= 400 and "copy.gguf" in second.text and "re-download" in second.text, second.text
        assert "Traceback" not in server.log()

        shutil.copyfile(original, model)  # the copy finished: the next job reads the new file
        third = _ask(server)
        assert third.status_code == 200, third.text
        assert third.json()["choices"][0]["message"]["content"] == answer
    finally:
        server.stop()
