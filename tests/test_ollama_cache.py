"""The prompt cache as `run serve`'s Ollama API reports it, to the real `ollama` client.

The session's server (tests/serve_helpers.py) serves the tiny GGUF on llama.cpp, whose prompt cache
keeps the prefix a resent conversation shares with the previous one.
"""

from __future__ import annotations

import httpx
import pytest

pytest.register_assert_rewrite("tests.serve_helpers")  # it is also this module's plugin (below)

# The servers are session fixtures, shared by every server test module: registered as a plugin.
pytest_plugins = ["tests.serve_helpers"]


def test_ollama_chat_counts_the_cached_part_of_a_resent_conversation(servers):
    """As Ollama documents it (docs.ollama.com/api/usage): prompt_eval_count is the whole prompt,
    prompt_eval_cached_count the part read from the cache. The ollama client (0.6) predates the
    second field and drops it, so the second answer is read off the wire as the client gets it."""
    ollama = pytest.importorskip("ollama")
    pytest.importorskip("llama_cpp")
    url = servers[0].url
    turns = [
        {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
        {"role": "user", "content": "What is the capital of Spain, the country in south-western Europe?"},
    ]
    first = ollama.Client(host=url, timeout=60).chat(
        model="tiny-gguf", messages=turns, options={"num_predict": 4, "seed": 1}, stream=False
    )
    more = turns + [
        {"role": "assistant", "content": first.message.content},
        {"role": "user", "content": "And of Portugal?"},
    ]
    r = httpx.post(
        f"{url}/api/chat",
        timeout=60,
        json={"model": "tiny-gguf", "messages": more, "options": {"num_predict": 4, "seed": 1}, "stream": False},
    )
    r.raise_for_status()
    second = r.json()
    assert second["done"] and second["prompt_eval_count"] > first.prompt_eval_count
    cached = second["prompt_eval_cached_count"]
    assert first.prompt_eval_count <= cached < second["prompt_eval_count"]  # the first turn, not the new one
