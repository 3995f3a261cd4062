"""The llama.cpp path of `run serve` under several clients: the prompt cache scoped per tenant
(issue 33, item 4) and the batched decode engine (issue 32, item 3).

Real `openai` clients against a real `run serve` subprocess on the tiny GGUF (tests/tiny/gguf_llama.py).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.register_assert_rewrite("tests.serve_helpers")  # it is also this module's plugin (below)
from tests.serve_helpers import Server, rows, server_env  # noqa: E402 (after its assert rewrite is registered)

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


def test_ollama_prompt_eval_cached_count_is_per_key_too(tenants):
    """The same through Ollama's /api/chat: B resending A's conversation is told 0 cached tokens,
    then its own resend is cached (read off the wire: the ollama client drops the field)."""
    convo = [
        {"role": "system", "content": "You are the clinic's assistant. Patient 7 has condition X."},
        {"role": "user", "content": "Summarise patient 7's file in one line."},
    ]
    assert _cached(_client(tenants, KEY_A), convo) == 0

    def ollama_cached(key: str) -> int:
        r = httpx.post(
            tenants.url + "/api/chat",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
            json={"model": "tiny-gguf", "messages": convo, "options": {"num_predict": 2, "seed": 1}, "stream": False},
        )
        r.raise_for_status()
        return r.json()["prompt_eval_cached_count"]

    assert ollama_cached(KEY_B) == 0  # B learns nothing of A's identical prompt
    assert ollama_cached(KEY_B) > 0  # B's own resend is cached for B
    # A's own prefix: in its slot when batched; gone from the one context, which B's tokens hold now
    assert (ollama_cached(KEY_A) > 0) is (tenants.parallel != "1")


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


# --------------------------------------------------------------------------- continuous batching

PROMPTS = [f"Write a long story about {x}." for x in ("a cat", "the sea", "a robot", "winter")]


@pytest.fixture(scope="module")
def pair(serve_env, session_cache):
    """(batched server, lone server): --parallel 3, and --parallel 1 (each answer decoded alone in
    the engine's own context: the single-stream path the batch must agree with). Both read every
    prompt whole (--prompt-cache off): a prompt read on top of a cached prefix rounds differently
    from a cold read on either path (pipelines/llm/llamacpp.py), and which prefix each path holds
    depends on the requests before; these tests compare the decoding. The tenant tests above
    cover the cache."""
    pytest.importorskip("llama_cpp")
    folder, toml, _ = serve_env
    made = []
    for name, parallel in (("batched", "3"), ("lone", "1")):
        d = folder / f"batch-{name}"
        d.mkdir()
        made.append(Server(d, server_env(d, session_cache, toml), "--parallel", parallel, "--prompt-cache", "off"))
    try:
        for s in made:
            s.wait_healthy()
        yield tuple(made)
    finally:
        for s in made:
            s.stop()


def _messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _lone(server: Server, prompt: str, max_tokens: int) -> str:
    r = _client(server, "none").chat.completions.create(
        model="tiny-gguf", messages=_messages(prompt), max_tokens=max_tokens, temperature=0
    )
    assert r.usage.completion_tokens >= 32, "a reference answer this short proves little"
    return r.choices[0].message.content


def _stream(server: Server, prompt: str, max_tokens: int, arrivals: list, index: int, stop_after: int = 0) -> str:
    """One streamed answer; each content chunk's arrival is appended to ``arrivals`` as (time,
    index). With ``stop_after``, the client closes the stream after that many chunks."""
    pieces = []
    stream = _client(server, "none").chat.completions.create(
        model="tiny-gguf", messages=_messages(prompt), max_tokens=max_tokens, temperature=0, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            arrivals.append((time.monotonic(), index))
            if stop_after and len(pieces) >= stop_after:
                stream.close()  # the client leaves mid-answer
                break
    return "".join(pieces)


def _together(fn, n: int) -> list:
    """``fn(i)`` for i < n on n threads released at once → their results in order."""
    start, out, errors = threading.Barrier(n), [None] * n, []

    def run(i):
        start.wait()
        try:
            out[i] = fn(i)
        except Exception as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


def _metric(server: Server, name: str) -> dict[str, float]:
    """The samples of ``name`` on /metrics for tiny-gguf, by their label text."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        if line.startswith(name) and 'model="tiny-gguf"' in line:
            labels, value = line.rsplit(" ", 1)
            found[labels[len(name) :]] = float(value)
    return found


def _steps(server: Server) -> tuple[float, float, float]:
    """(decode steps, steps of one sequence, steps of at most 3) from the step-size histogram."""
    h = _metric(server, "taskrun_batch_step_sequences")
    one = next(v for k, v in h.items() if 'le="1.0"' in k)
    three = next(v for k, v in h.items() if 'le="3.0"' in k)
    return next(v for k, v in h.items() if k.startswith("_count")), one, three


def test_concurrent_streams_share_one_batch_and_match_lone_runs(pair):
    """Four real openai clients at once on a --parallel 3 server: their chunks arrive interleaved
    in time, decode steps held several sequences (never more than 3: the fourth waited for a
    slot), and each answer is the one a lone request gets on the single-stream path (temperature 0)."""
    batched, lone = pair
    want = [_lone(lone, p, 64) for p in PROMPTS]
    first32 = [_lone(lone, p, 32) for p in PROMPTS]
    arrivals: list = []
    got = _together(lambda i: _stream(batched, PROMPTS[i], 64, arrivals, i), len(PROMPTS))
    for i in range(len(PROMPTS)):
        _agrees(got[i], want[i], first32[i], i)
    order = [i for _, i in sorted(arrivals)]
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches > len(PROMPTS), f"the streams came one after another: {order}"
    steps, one, three = _steps(batched)
    assert steps - one > 0, "no decode step held more than one sequence"
    assert three == steps, "a decode step held more sequences than --parallel 3"
    assert _metric(batched, "taskrun_batch_running_sequences") == {"": 0.0} or all(
        v == 0 for v in _metric(batched, "taskrun_batch_running_sequences").values()
    )


def test_a_client_that_leaves_cancels_only_its_sequence(pair):
    """Three streaming clients; one closes its stream after 3 chunks. Its job is logged as
    cancelled by the client, the other two answers are their lone runs' to the end, and the
    freed slot serves the next request."""
    batched, lone = pair
    prompts = PROMPTS[:3]
    want = [_lone(lone, p, 400) for p in prompts]
    first32 = [_lone(lone, p, 32) for p in prompts]
    arrivals: list = []
    got = _together(lambda i: _stream(batched, prompts[i], 400, arrivals, i, stop_after=3 if i == 0 else 0), 3)
    _agrees(got[1], want[1], first32[1], 1)
    _agrees(got[2], want[2], first32[2], 2)
    assert len(got[1]) > 0.9 * len(want[1]) and len(got[2]) > 0.9 * len(want[2])  # not cut short
    assert len(got[0]) < len(want[0])
    deadline = time.monotonic() + 10
    while not [r for r in rows(batched, status="failed") if "cancelled by the client" in (r.get("error") or "")]:
        assert time.monotonic() < deadline, "the closed stream's job was not cancelled"
        time.sleep(0.1)
    assert _lone(batched, PROMPTS[3], 64) == _lone(lone, PROMPTS[3], 64)


def _agrees(got: str, want: str, first32: str, i: int) -> None:
    """``got`` (batched) against ``want`` (the same request alone, temperature 0): equal where the
    kernels round alike, and in any case equal over the first 32 tokens (``first32`` is the lone
    answer cut at 32 tokens). A step of several sequences runs other kernels than a step of one,
    so a near-tie can flip later on: measured on the tiny model, 400-token answers sometimes part
    after ~400 of ~700 characters (the failure message says where)."""
    common = _common(got, want)
    head = first32.rstrip("\ufffd")  # a cut can end inside a multi-byte character
    assert common >= len(head), (
        f"answer {i} leaves its lone run after {common} characters, within its first 32 tokens ({len(head)} characters)"
    )


def _common(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_default_parallel_follows_memory():
    """--parallel 0: up to 4 sequences, fewer when their KV caches would take over a quarter of
    the memory available, never none."""
    from taskrun.pipelines.llm.llamacpp_batch import auto_slots

    mb = 1 << 20
    assert auto_slots(100 * mb, available=8000 * mb) == 4
    assert auto_slots(100 * mb, available=1000 * mb) == 2  # 250 MB for KV: two 100 MB caches
    assert auto_slots(100 * mb, available=100 * mb) == 1


def test_a_burst_beyond_the_queue_gets_503_with_retry_after(serve_env, session_cache):
    """--parallel 2 --max-queue 1: of 4 long batched requests sent at once, some are answered 503
    with Retry-After (the existing queue's answer), the others end with their answer, and no
    decode step holds more than 2 sequences. (Which ones get 503 depends on when their threads
    start: the bound itself is tested on the worker below.)"""
    pytest.importorskip("llama_cpp")
    folder, toml, _ = serve_env
    d = folder / "batch-queue"
    d.mkdir()
    server = Server(d, server_env(d, session_cache, toml), "--parallel", "2", "--max-queue", "1")
    try:
        server.wait_healthy()
        body = {"model": "tiny-gguf", "messages": _messages(PROMPTS[0]), "max_tokens": 400, "temperature": 0}

        def send(i):
            return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)

        answers = _together(send, 4)
        codes = sorted(r.status_code for r in answers)
        assert codes.count(503) >= 1 and set(codes) <= {200, 503}, codes
        assert all(r.headers.get("retry-after") for r in answers if r.status_code == 503)
        assert all(r.json()["choices"][0]["message"]["content"] for r in answers if r.status_code == 200)
        h = _metric(server, "taskrun_batch_step_sequences")
        assert next(v for k, v in h.items() if 'le="2.0"' in k) == next(
            v for k, v in h.items() if k.startswith("_count")
        )
    finally:
        server.stop()


def test_parallel_bounds_the_batch_threads_and_the_queue_waits_beyond():
    """A model's worker with --parallel 2 and --max-queue 1: two batched jobs run at once, a third
    waits for a thread, a fourth is refused (QueueFull: the 503), and all three admitted end."""
    import asyncio

    from taskrun.runner.serve.workers import ModelWorker, QueueFull

    async def main():
        worker, gate, started = ModelWorker("m", max_queue=1, parallel=2), threading.Event(), []

        def job():
            started.append(1)
            gate.wait(10)
            return 1

        jobs = []
        try:
            for _ in range(3):
                worker.admit()
                jobs.append(asyncio.ensure_future(worker.run(job, batched=True)))
                await asyncio.sleep(0.2)
            assert len(started) == 2 and worker.waiting == 1
            with pytest.raises(QueueFull):
                worker.admit()
        finally:
            gate.set()
        assert await asyncio.gather(*jobs) == [1, 1, 1]
        worker.close()

    asyncio.run(main())
