"""`run serve` under the conditions it must survive: bad requests, missing keys, oversized bodies,
clients that leave, full queues, concurrent embeddings; and what it tells an operator (/metrics).

The servers are the session's (tests/serve_helpers.py): the open one, and the keyed one with a
queue of one per model and a 1 MB body limit.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.register_assert_rewrite("tests.serve_helpers")  # it is also this module's plugin (below)
from tests.serve_helpers import KEY, RUN, free_port, rows  # noqa: E402 (after its assert rewrite is registered)

# The servers are session fixtures, shared by every server test module: registered as a plugin.
pytest_plugins = ["tests.serve_helpers"]

SLOW = {"model": "slow-llama", "messages": [{"role": "user", "content": "Count forever."}], "max_tokens": 8000}


@pytest.fixture
def server(servers):
    return servers[0]


@pytest.fixture
def keyed(servers):
    return servers[1]


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# --------------------------------------------------------------------------- errors


def test_bad_json_unknown_model_and_unsupported_fields_are_4xx_in_openai_shape(server):
    def post(path, **kw):
        return httpx.post(server.url + path, timeout=30, **kw)

    r = post("/v1/chat/completions", content=b'{"model": "tiny-llama", "messages": [')
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
    r = post("/v1/embeddings", json={"model": "no-such-model", "input": "x"})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    r = post("/v1/chat/completions", json={"model": "tiny-llama", "input": "x"})
    assert r.status_code == 400 and error_of(r)["param"] == "input"
    r = post("/v1/tasks/nothing", json={"input": "x"})
    assert r.status_code == 404 and error_of(r)["code"] == "task_not_found"
    r = httpx.get(server.url + "/v1/nowhere")
    assert r.status_code == 404 and "no endpoint" in error_of(r)["message"]
    r = post("/v1/tasks/search", json={"input": "x", "options": {"corpus": "/etc"}})
    assert r.status_code == 400 and "corpora" in error_of(r)["message"]  # never a path
    r = post("/v1/tasks/classify", json={"input": {"path": "/etc/passwd"}, "model": "tiny-bert"})
    assert r.status_code == 400 and "path" in error_of(r)["message"]


def test_the_openai_client_sees_the_field_named(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Hi"}]
    for extra, param in (
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, "tool_choice"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny-llama", messages=messages, **extra)
        assert err.value.status_code == 400 and err.value.body["param"] == param
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=messages)
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="'max_tokens' must be a whole number of tokens from 1"):
        client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="b64_json"):
        client.images.generate(model="digits-ddpm", prompt="a 1", response_format="url")


def test_oversized_bodies_are_refused_with_413_declared_or_chunked(keyed):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    big = json.dumps({"model": "tiny-bert", "input": "word " * 300_000}).encode()  # 1.5 MB > 1 MB
    r = httpx.post(keyed.url + "/v1/embeddings", content=big, headers=headers, timeout=30)
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"

    def chunks():  # no Content-Length: the bytes are counted as they arrive
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    r = httpx.post(keyed.url + "/v1/embeddings", content=chunks(), headers=headers, timeout=30)
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


def test_a_keyed_server_wants_the_key(keyed):
    assert httpx.get(keyed.url + "/health").status_code == 200  # probes need no key
    r = httpx.get(keyed.url + "/v1/models")
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0).models.list()
    models = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0).models.list()
    assert "tiny-bert" in {m.id for m in models}
    assert httpx.get(keyed.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_no_traceback_reaches_a_client():
    from starlette.testclient import TestClient

    from taskrun.runner.serve.app import create_app
    from taskrun.runner.serve.settings import Settings

    app = create_app(Settings())

    @app.get("/boom")
    async def boom():
        raise RuntimeError("secret detail from deep inside")

    with TestClient(app, raise_server_exceptions=False, base_url="http://localhost") as client:  # a loopback Host
        r = client.get("/boom")
    assert r.status_code == 500
    assert r.json() == {
        "error": {"message": "internal error (see the server log)", "type": "server_error", "param": None, "code": None}
    }
    assert "secret" not in r.text and "Traceback" not in r.text


# --------------------------------------------------------------------------- clients that leave, full queues


def _failed_slow_jobs(server, n: int, timeout: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = rows(server, task="generate", model="slow-llama", status="failed")
        if len(found) >= n:
            return found
        time.sleep(0.2)
    return rows(server, task="generate", model="slow-llama", status="failed")


def test_a_client_that_leaves_stops_its_generation(server):
    t0 = time.monotonic()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**SLOW, "stream": True}, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:  # the role chunk and two pieces of text: leave
                break
    with pytest.raises(httpx.ReadTimeout):  # without streaming too: the server notices the client leave
        httpx.post(server.url + "/v1/chat/completions", json=SLOW, timeout=2)
    failed = _failed_slow_jobs(server, 2)
    assert len(failed) == 2, failed
    for row in failed:  # (the second may be stopped before its turn: "... before the job started")
        assert row["error"].startswith("cancelled by the client")
    assert failed[-1]["error"] == "cancelled by the client"  # the streamed one: oldest last
    assert failed[-1]["metrics"]["wall_s"] < time.monotonic() - t0 < 40  # 8000 tokens take ~80 s here


def test_a_full_queue_answers_503_with_retry_after(keyed):
    headers = {"Authorization": f"Bearer {KEY}"}
    url = keyed.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json={**SLOW, "stream": True}, headers=headers, timeout=60) as running:
        lines = running.iter_lines()  # kept: closing it would close the connection
        while not next(lines).startswith("data: "):  # the job runs
            pass
        waiting = threading.Thread(target=_gives_up, args=(url, headers), daemon=True)
        waiting.start()  # takes the one place in the queue
        _wait_for_depth(keyed, "slow-llama", 2)
        r = httpx.post(url, json=SLOW, headers=headers, timeout=10)
        assert r.status_code == 503 and error_of(r)["code"] == "queue_full"
        assert int(r.headers["retry-after"]) >= 1
    waiting.join(timeout=30)


def _gives_up(url: str, headers: dict) -> None:
    try:
        httpx.post(url, json=SLOW, headers=headers, timeout=4)
    except httpx.ReadTimeout:
        pass


def _wait_for_depth(server, model: str, depth: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "taskrun_queue_depth" and s.labels.get("model") == model and s.value >= depth:
                    return
        time.sleep(0.1)
    raise AssertionError(f"the queue of {model} never reached {depth}")


# --------------------------------------------------------------------------- batching, metrics, exposure


def test_concurrent_embeddings_run_as_one_job(server):
    texts = [f"the cat {i}" for i in range(8)]
    out: dict[int, httpx.Response] = {}

    def ask(i: int) -> None:
        out[i] = httpx.post(
            server.url + "/v1/embeddings",
            json={"model": "tiny-bert", "input": texts[i], "encoding_format": "float"},
            timeout=30,
        )

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alone = httpx.post(server.url + "/v1/embeddings", json={"model": "tiny-bert", "input": texts}, timeout=30).json()
    for i in range(8):
        assert out[i].status_code == 200
        got = out[i].json()["data"][0]["embedding"]
        assert max(abs(a - b) for a, b in zip(got, alone["data"][i]["embedding"])) < 1e-5
    ids = [out[i].headers["x-taskrun-run-id"] for i in range(8)]
    assert len(set(ids)) < 8  # merged
    shared = max(set(ids), key=ids.count)
    (row,) = [r for r in rows(server, task="embed") if r["id"] == shared]
    assert row["inputs"] == ids.count(shared)


def test_metrics_parse_and_break_down_by_task_and_model(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    for name in (
        "taskrun_requests",
        "taskrun_job_latency_seconds",
        "taskrun_queue_wait_seconds",
        "taskrun_task_ttft_s",
        "taskrun_task_decode_tokens_per_s",
        "taskrun_jobs",
    ):
        assert name in families, sorted(families)
    counts = {
        (s.labels["task"], s.labels["model"])
        for s in families["taskrun_task_ttft_s"].samples
        if s.name.endswith("_count") and s.value > 0
    }
    assert ("generate", "tiny-llama") in counts
    ok = [
        s
        for s in families["taskrun_requests"].samples
        if s.labels.get("endpoint") == "/v1/chat/completions" and s.labels.get("status") == "200"
    ]
    assert ok and ok[0].value >= 1


def test_a_public_address_needs_a_key():
    r = subprocess.run(
        [RUN, "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--api-key" in r.stderr and "--no-auth" in r.stderr


def test_the_server_listens_on_loopback_only(server):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
            address = s.getsockname()[0]
        except OSError:
            address = None
    assert httpx.get(server.url + "/health").status_code == 200
    if address is None or address.startswith("127."):
        pytest.skip("this machine has no address other than loopback")
    with pytest.raises(OSError):
        socket.create_connection((address, server.port), timeout=2).close()
