"""The llama.cpp path of `run serve` under several clients: the prompt cache scoped per tenant
(issue 33, item 4) and the batched decode engine (issue 32, item 3).

Real `openai` clients against a real `run serve` subprocess on the tiny GGUF (tests/tiny/gguf_llama.py).
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("tests.serve_helpers")  # it is also this module's plugin (below)
from tests.serve_helpers import Server, server_env  # noqa: E402 (after its assert rewrite is registered)

pytest_plugins = ["tests.serve_helpers"]

KEY_A, KEY_B = "tenant-a-key-0001", "tenant-b-key-0002"
SECRET = [
    {"role": "system", "content": "You are a bank assistant. The customer's PIN is 4 8 1 5 and must stay secret."},
    {"role": "user", "content": "What is my balance?"},
]


def _client(server: Server, key: str):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def _cached(client, messages) -> int:
    r = client.chat.completions.create(model="tiny-gguf", messages=messages, max_tokens=2, seed=1)
    return r.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module", params=["1", "0"], ids=["one-context", "batched"])
def tenants(request, serve_env, session_cache):
    """A server with two keys, each a tenant (--prompt-cache tenant, the default): one llama.cpp
    context decoding one answer at a time (--parallel 1), or the batch of slots (the default)."""
    pytest.importorskip("llama_cpp")
    folder, toml, _ = serve_env
    d = folder / f"tenants-{request.param}"
    d.mkdir()
    server = Server(
        d, server_env(d, session_cache, toml), "--api-key", KEY_A, "--api-key", KEY_B, "--parallel", request.param
    )
    server.parallel = request.param
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def test_cached_tokens_never_tell_one_key_about_another_keys_prompt(tenants):
    """Client B sends A's system prompt (a guess at the PIN): with a cache shared across keys,
    B's cached_tokens would say how far its guess matched A's prompt; scoped per key it is 0.
    A's own next request still reuses A's prefix, and only A's."""
    a, b = _client(tenants, KEY_A), _client(tenants, KEY_B)
    assert _cached(a, SECRET) == 0
    guess = [SECRET[0], {"role": "user", "content": "What is my balance? And my last payment?"}]
    assert _cached(b, guess) == 0  # B learns nothing of A's prompt
    b_own = _cached(b, guess)
    assert b_own > 0  # B's own prefix is cached for B
    if tenants.parallel == "1":
        assert _cached(a, guess) == 0  # one context: B's tokens were the last in it, and never A's
        assert _cached(a, guess) > 0
    else:
        # slots: A's slot still holds A's first prompt, which shares less with the guess than
        # B's own copy of it (all but its last token); a hit from B's slot would equal b_own
        a_hit = _cached(a, guess)
        assert 0 < a_hit < b_own
        assert _cached(a, guess) == b_own  # now A has the whole guess in its own slot


def test_prompt_cache_shared_and_off(serve_env, session_cache):
    """--prompt-cache shared reuses across keys (the operator's choice); off never reuses."""
    pytest.importorskip("llama_cpp")
    folder, toml, _ = serve_env
    for mode, second in (("shared", True), ("off", False)):
        d = folder / f"cache-{mode}"
        d.mkdir()
        server = Server(
            d, server_env(d, session_cache, toml), "--api-key", KEY_A, "--api-key", KEY_B, "--prompt-cache", mode
        )
        try:
            server.wait_healthy()
            assert _cached(_client(server, KEY_A), SECRET) == 0
            assert (_cached(_client(server, KEY_B), SECRET) > 0) is second, mode
        finally:
            server.stop()
