"""`run generate|embed|chat --endpoint URL --model NAME`: the same commands on an OpenAI- or
Ollama-compatible server. Against real servers on loopback: taskrun's own `run serve` in a
subprocess (tiny models, a key from TASKRUN_API_KEY), and a tiny HTTP server here that answers
429 or 503 before it answers. Offline."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.fake_openai import fake_server

KEY = "sk-endpoint-secret-51c2"
PROMPT = "Name a colour."


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_dir, session_cache):
    from tests.serve_helpers import Server, models_toml, server_env
    from tests.tiny import bert
    from tests.tiny.generate import build

    folder = tmp_path_factory.mktemp("endpoint-serve")
    aliases = {"tiny-llama": {"local": str(build(tiny_dir))}, "tiny-bert": {"local": str(bert.build(tiny_dir))}}
    toml = models_toml(aliases, folder)
    env = {**server_env(folder, session_cache, toml), "TASKRUN_API_KEY": KEY}
    server = Server(folder, env, "--preload", "tiny-llama")
    try:
        server.wait_healthy()
        yield server, toml
    finally:
        server.stop()


def run(toml, *args, key: str | None = KEY, code: int = 0, log_db=None, input=None):
    env = {"TASKRUN_MODELS_TOML": str(toml), "EP_KEY": key}
    if log_db:  # else the test's own log (conftest): a None here would unset it, and the user's log would take the rows
        env["TASKRUN_LOG_DB"] = str(log_db)
    r = CliRunner().invoke(main, list(args), env=env, input=input, catch_exceptions=False)
    assert r.exit_code == code, r.output
    assert KEY not in r.output
    return r


GEN = ("--max-tokens", "12", "--temperature", "0")


@pytest.mark.parametrize("door", ["openai", "ollama"])
def test_generate_on_an_endpoint_gives_the_local_text(served, door, tmp_path):
    server, toml = served
    db = tmp_path / "runs.db"
    local = json.loads(run(toml, "generate", PROMPT, "-m", "tiny-llama", *GEN, "--json", log_db=db).stdout)
    url = server.url + "/v1" if door == "openai" else server.url
    args = ("generate", PROMPT, "--endpoint", url, "--model", "tiny-llama", *GEN, "--api-key-env", "EP_KEY")
    remote = json.loads(run(toml, *args, "--json", log_db=db).stdout)
    assert remote["items"][0]["result"]["text"] == local["items"][0]["result"]["text"] != ""
    m = remote["metrics"]
    assert m["output_tokens"] == local["metrics"]["output_tokens"] and 0 < m["ttft_s"] <= m["wall_s"]
    # streamed as it comes, then the metrics table (text mode)
    shown = run(toml, "generate", PROMPT, "-m", "tiny-llama", *GEN, log_db=db).stdout
    assert run(toml, *args, log_db=db).stdout == shown
    row = RunLog(str(db)).recent(1)[0]
    assert row["runtime"] == f"endpoint:{door}" and row["model_path"] == url
    assert row["model"] == "tiny-llama" and row["model_digest"]
    assert KEY not in db.read_bytes().decode("latin-1")
    note = " ".join(row.get("notes") or [])
    assert "at this client" in note and ("eval_s" in note if door == "ollama" else "usage" in note)


@pytest.mark.parametrize("door", ["openai", "ollama"])
def test_embed_on_an_endpoint_gives_the_local_vectors(served, door, tmp_path):
    server, toml = served
    texts = ("a red apple", "the meeting is on Tuesday")
    local = json.loads(run(toml, "embed", *texts, "-m", "tiny-bert", "--json", log_db=tmp_path / "r.db").stdout)
    url = server.url + "/v1" if door == "openai" else server.url
    args = ("embed", *texts, "--endpoint", url, "--model", "tiny-bert", "--api-key-env", "EP_KEY", "--json")
    remote = json.loads(run(toml, *args, log_db=tmp_path / "r.db").stdout)
    a = np.array([r["result"]["vector"] for r in local["items"]])
    b = np.array([r["result"]["vector"] for r in remote["items"]])
    assert a.shape == b.shape and np.allclose(a, b, atol=1e-4)
    assert remote["metrics"]["items"] == 2 and remote["metrics"]["dim"] == a.shape[1]


def test_chat_on_an_endpoint_keeps_the_conversation(served, tmp_path):
    server, toml = served
    db = tmp_path / "chat.db"
    args = ("chat", "--endpoint", server.url + "/v1", "--model", "tiny-llama", "--api-key-env", "EP_KEY")
    run(toml, *args, "--max-tokens", "6", input="Hi\nAnd again?\n", log_db=db)
    rows = RunLog(str(db)).recent(10)
    assert len(rows) == 2 and {r["runtime"] for r in rows} == {"endpoint:openai"}


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("status", [429, 503])
def test_retries_are_counted_and_the_final_answer_shown(status, tmp_path):
    db = tmp_path / "runs.db"
    with fake_server(fails=2, status=status) as (url, fake):
        r = run(tmp_path / "none.toml", "generate", "hi", "--endpoint", url, "--model", "flaky", "--json", log_db=db)
    out = json.loads(r.stdout)
    assert out["items"][0]["result"]["text"] == "the final answer" and fake.seen == 3
    row = RunLog(str(db)).recent(1)[0]
    assert "retries 2" in " ".join(row["notes"]) and row["model"] == "fake-1"
    assert row["model_path"] == url and row["status"] == "ok"


def test_too_many_failures_name_the_endpoint_and_the_retries(tmp_path):
    with fake_server(fails=9, status=503) as (url, fake):
        r = run(
            tmp_path / "none.toml",
            "generate",
            "hi",
            "--endpoint",
            url,
            "--model",
            "flaky",
            code=1,
            log_db=tmp_path / "r.db",
        )
    assert f"endpoint openai:{url}#flaky: HTTP 503 (after 2 retries)" in r.output
    assert RunLog(str(tmp_path / "r.db")).recent(1)[0]["status"] == "failed"


def test_a_refused_port_names_the_endpoint(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    url = f"http://127.0.0.1:{port}"
    for cmd in (("generate", "hi"), ("embed", "hi")):
        r = run(tmp_path / "none.toml", *cmd, "--endpoint", url, "--model", "m", code=1, log_db=tmp_path / "r.db")
        assert f"endpoint ollama:{url}#m: connection refused" in r.output and "after 2 retries" in r.output


def test_bad_endpoint_usage_names_the_fix(tmp_path):
    toml = tmp_path / "none.toml"
    r = run(toml, "generate", "hi", "--endpoint", "http://127.0.0.1:1/v1", code=1)
    assert "--model NAME" in r.output
    r = run(toml, "generate", "hi", "--endpoint", "http://u:sekrit@127.0.0.1:1/v1", "--model", "m", code=1)
    assert "--api-key-env" in r.output and "sekrit" not in r.output
    r = run(toml, "generate", "hi", "--endpoint", "http://127.0.0.1:1/v1", "--model", "m", "--top-k", "5", code=1)
    assert "--top-k" in r.output and "not sent to an endpoint" in r.output
    r = run(toml, "generate", "hi", "--endpoint", "http://127.0.0.1:1/v1", "--model", "m", "--device", "cpu", code=1)
    assert "--device" in r.output
    r = run(toml, "generate", "hi", "--endpoint", "http://127.0.0.1:1/v1", "-m", "m", "--api-key-env", "NOPE_X", code=1)
    assert "NOPE_X" in r.output and "not set" in r.output
