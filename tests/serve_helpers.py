"""`run serve` in a subprocess for the server tests: tiny models registered under aliases, a free
port on 127.0.0.1, the test's private run log and cache, and a wait for /health.

The server's models.toml holds only the tiny models and taskrun's own digits-ddpm, and points
every task's default at them, so no test (and no GET /v1/models) touches the real weights.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.tiny import done, once

RUN = str(Path(sys.executable).parent / "run")
KEY = "test-key-1234"


def build_slow_llama(root: Path) -> Path:
    """A random Llama that never ends its answer (the end-of-turn logit is held at 0 while the
    others are large) with an 8k window: generation runs until max_tokens, ~100 tokens/s on
    two cores, so a test can interrupt it."""
    folder, ready = once(root, "slow-llama")
    if ready:
        return folder
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tests.tiny.generate import build

    tok = AutoTokenizer.from_pretrained(str(build(root)))
    tok.model_max_length = 8192
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] = 0
    model.save_pretrained(folder)
    done(folder)
    return folder


def tiny_aliases(root: Path) -> dict[str, dict]:
    from tests.tiny import bert, generate, vision, whisper

    return {
        "tiny-llama": {"local": str(generate.build(root))},
        "slow-llama": {"local": str(build_slow_llama(root))},
        "tiny-bert": {"local": str(bert.build(root))},
        "tiny-whisper": {"local": str(whisper.build_ct2(root))},
        "tiny-yolos": {"local": str(vision.build_yolos(root))},
        **_tiny_gguf(root),
    }


def _tiny_gguf(root: Path) -> dict[str, dict]:
    """The tiny GGUF on llama.cpp (its prompt cache), where llama-cpp-python is installed."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return {}
    from tests.tiny.gguf_llama import build

    return {"tiny-gguf": {"local": str(build(root))}}


def corpus(folder: Path) -> Path:
    """Two small notes for search (served as --corpus docs=...)."""
    d = folder / "corpus"
    d.mkdir(exist_ok=True)
    (d / "cats.md").write_text("# Kittens\n\nA kitten stays with its mother for eight weeks.\n")
    (d / "stocks.md").write_text("# Markets\n\nStock prices fell on Friday after the report.\n")
    return d


def models_toml(aliases: dict[str, dict], folder: Path) -> Path:
    """A models.toml with ``aliases``, digits-ddpm, and defaults that name only them."""
    from taskrun.models.resolve import CONFIG_DIR, _load_config

    shipped = _load_config(str(CONFIG_DIR / "models.toml"))
    models = {**aliases, "digits-ddpm": shipped["models"]["digits-ddpm"]}
    defaults = {
        "embed": "tiny-bert",
        "search": "tiny-bert",
        "classify:text": "tiny-bert",
        "generate": "tiny-llama",
        "summarize": "tiny-llama",
        "transcribe": "tiny-whisper",
        "image": "digits-ddpm",
    }
    lines = ["[defaults]"] + [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in defaults.items()]
    for name, entry in models.items():
        lines.append(f"\n[models.{json.dumps(name)}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    path = folder / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `run serve` subprocess; ``url`` once it is up. Its stderr goes to ``log_file``."""

    def __init__(self, folder: Path, env: dict[str, str], *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.log_db = env["TASKRUN_LOG_DB"]
        self.log_file = folder / f"serve-{self.port}.log"
        self._err = open(self.log_file, "wb")
        self.proc = subprocess.Popen(
            [RUN, "serve", "--port", str(self.port), *args],
            env=env,
            cwd=folder,
            stdout=self._err,
            stderr=subprocess.STDOUT,
        )

    def wait_healthy(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"run serve exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"run serve did not become healthy in {timeout:.0f} s:\n{self.log()}")

    def log(self) -> str:
        self._err.flush()
        return self.log_file.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


def server_env(folder: Path, cache: Path, toml: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TASKRUN_LOG_DB=str(folder / "runs.db"),
        TASKRUN_CACHE_DIR=str(cache),
        TASKRUN_MODELS_TOML=str(toml),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("TASKRUN_API_KEY", None)
    env.pop("TASKRUN_DEBUG", None)
    return env


@contextmanager
def shipped_server(folder: Path, cache: Path, *args: str, timeout: float = 300.0):
    """A `run serve` on the shipped models.toml (the real packaged weights: for tests marked
    real), with its own run log in ``folder``, the session's cache, and no key; stopped after."""
    env = dict(
        os.environ,
        TASKRUN_LOG_DB=str(folder / "runs.db"),
        TASKRUN_CACHE_DIR=str(cache),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    for key in ("TASKRUN_MODELS_TOML", "TASKRUN_API_KEY", "TASKRUN_DEBUG"):
        env.pop(key, None)
    server = Server(folder, env, *args)
    try:
        server.wait_healthy(timeout=timeout)
        yield server
    finally:
        server.stop()


def run_log_row(server: Server, run_id: str, timeout: float = 10.0) -> dict:
    """The run-log row of ``run_id`` (waiting for it: a cancelled job logs as its thread ends)."""
    from taskrun.runner.runlog.store import RunLog

    deadline = time.monotonic() + timeout
    while True:
        row = RunLog(server.log_db).get(run_id) if run_id else None
        if row is not None or time.monotonic() > deadline:
            return row
        time.sleep(0.1)


def rows(server: Server, **match) -> list[dict]:
    from taskrun.runner.runlog.store import RunLog

    return [r for r in RunLog(server.log_db).recent(1000) if all(r.get(k) == v for k, v in match.items())]


# --------------------------------------------------------------------------- session fixtures


@pytest.fixture(scope="session")
def serve_env(tmp_path_factory, tiny_dir):
    """(folder, models.toml, search corpus) shared by the servers and the CLI runs the tests
    compare with."""
    folder = tmp_path_factory.mktemp("serve")
    return folder, models_toml(tiny_aliases(tiny_dir), folder), corpus(folder)


@pytest.fixture(scope="session")
def servers(serve_env, session_cache):
    """(open server, keyed server), started together. The open one preloads the tiny models;
    it serves the corpus as "docs". The keyed one takes a key, queues one request per model,
    reads 1 MB bodies at most, and preloads the slow model its queue test fills."""
    folder, toml, docs = serve_env
    made = []
    for name, args in (
        ("open", ("--preload", "tiny-llama", "--preload", "tiny-bert", "--corpus", f"docs={docs}")),
        ("keyed", ("--api-key", KEY, "--max-queue", "1", "--max-body-mb", "1", "--preload", "slow-llama")),
    ):
        d = folder / name
        d.mkdir()
        made.append(Server(d, server_env(d, session_cache, toml), *args))
    try:
        for s in made:
            s.wait_healthy()
        yield tuple(made)
    finally:
        for s in made:
            s.stop()
