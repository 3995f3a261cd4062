"""run eval: the checks, setups, the report's arithmetic, the endpoint client's errors (no key in
any message), and the endpoint client against real servers on loopback. Offline, tiny models."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from taskrun.pipelines.llm.endpoint_client import Endpoint, parse_spec, safe_url
from taskrun.runner.eval import report
from taskrun.runner.eval.attempt import Attempt
from taskrun.runner.eval.cases import Case, check
from taskrun.runner.eval.setups import parse_setup
from taskrun.tasks.base import TaskError
from tests.serve_helpers import RUN


def case(**checks):
    return Case("c", [{"role": "user", "content": "q"}], checks)


@pytest.mark.parametrize(
    ("checks", "answer", "ok"),
    [
        ({"contains": ["a", "b"]}, "a b", True),
        ({"contains": ["a", "z"]}, "a b", False),
        ({"contains": ["a", "z"], "match": "any"}, "a b", True),
        ({"not_contains": "sorry"}, "Sorry, no", False),
        ({"regex": r"^\d+$"}, "42", True),
        ({"equals": "Paris"}, "  paris. ", True),
        ({"number": 3.14, "tolerance": 0.01}, "about 3.141", True),
        ({"number": 1000}, "1,000", True),
        ({"number": 7}, "six", False),
        ({"number": 12}, "144 divided by 12 is 1.44", False),  # seen from smollm2: the question's 12 echoed
        ({"number": 42}, "17 + 25 = 42.", True),
        ({"choices": ["positive", "negative"], "label": "negative"}, "Negative.", True),
        ({"choices": ["positive", "negative"], "label": "negative"}, "positive", False),
        ({"json_schema": {"type": "object", "required": ["a"]}}, 'Here: {"a": 1}', True),
        ({"json_schema": {"type": "object", "required": ["a"]}}, '{"b": 1}', False),
    ],
)
def test_checks(checks, answer, ok):
    assert check(case(**checks), answer)[0] is ok


def test_setups_parse_local_and_endpoint():
    (s,) = parse_setup("smollm2-135m@temperature=0,max_tokens=8,runtime=transformers")
    assert (s.model, s.runtime, s.options) == ("smollm2-135m", "transformers", {"temperature": 0.0, "max_tokens": 8})
    (e,) = parse_setup("ollama:http://127.0.0.1:11434#llama3.2@max_tokens=4")
    assert e.endpoint == "ollama:http://127.0.0.1:11434#llama3.2" and e.options == {"max_tokens": 4}
    assert parse_spec("http://h:11434#m")[0] == "ollama" and parse_spec("http://h:8000/v1#m")[0] == "openai"
    with pytest.raises(TaskError, match="unknown option"):
        parse_setup("smollm2-135m@colour=red")


def test_no_credentials_in_urls_or_errors(monkeypatch):
    assert safe_url("http://user:secret@h:8/v1?key=secret") == "http://h:8/v1"
    with pytest.raises(TaskError) as err:
        parse_setup("openai:http://user:secret-key@127.0.0.1:9/v1#m")
    assert "secret" not in str(err.value)
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    ep = Endpoint.from_spec("openai:http://127.0.0.1:9/v1#m", "MY_KEY", max_retries=1, timeout_s=2)
    with pytest.raises(TaskError) as err:  # nothing listens on port 9: refused, retried once
        ep.chat([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert "127.0.0.1:9" in str(err.value) and "refused" in str(err.value) and "sk-very" not in str(err.value)


def test_report_arithmetic():
    ok1 = Attempt("a", "s", 1, accepted=True, completion_s=1.0, cost=0.2, output_tokens=10, ttft_s=0.1)
    cut = Attempt("b", "s", 1, finish_reason="length", completion_s=2.0, cost=0.4, output_tokens=20, ttft_s=0.2)
    ok2 = Attempt("b", "s", 2, accepted=True, completion_s=1.0, cost=0.2, output_tokens=10, ttft_s=0.3)
    s = report.summarize({"a": [ok1], "b": [cut, ok2]})
    assert (s["accepted"], s["first_try"], s["incomplete"], s["retries"]) == (2, 1, 1, 1)
    assert s["cost_per_accepted"] == pytest.approx(0.4) and s["time_per_accepted_s"] == pytest.approx(2.0)
    assert s["ttft_p50_s"] == 0.2 and s["ttft_p95_s"] == 0.3
    assert "fastest per accepted answer: s" in report.verdict({"s": s}, None)


# --------------------------------------------------------------------------- against real servers
# `run serve` in a subprocess (tiny-llama, key from TASKRUN_API_KEY so no key is in its argv either)
# and llama-cpp-python's own server on the tiny GGUF: the endpoint client drives them over loopback,
# and `run eval` compares their answers with the same model run locally.

KEY = "sk-eval-secret-7f3a"
CASES = [
    {"id": "any", "prompt": "What is the capital of France?", "not_contains": "qqqzzz"},
    {"id": "never", "prompt": "Count from one to ten.", "contains": "qqqzzz"},
    {"id": "sys", "system": "Answer in one word.", "prompt": "The capital of France?", "not_contains": "qqqzzz"},
]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_dir, session_cache):
    from tests.serve_helpers import Server, models_toml, server_env
    from tests.tiny.generate import build

    folder = tmp_path_factory.mktemp("eval-serve")
    aliases = {"tiny-llama": {"local": str(build(tiny_dir))}}
    if importlib.util.find_spec("llama_cpp") is not None:
        from tests.tiny.gguf_llama import build as build_gguf

        aliases["tiny-gguf"] = {"local": str(build_gguf(tiny_dir))}
    toml = models_toml(aliases, folder)
    env = {**server_env(folder, session_cache, toml), "TASKRUN_API_KEY": KEY}
    server = Server(folder, env, "--preload", "tiny-llama")
    try:
        server.wait_healthy()
        yield server, toml, aliases
    finally:
        server.stop()


@pytest.fixture
def cases_file(tmp_path):
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CASES))
    return path


def eval_json(toml, cases_file, *args, key: str | None = KEY) -> dict:
    from click.testing import CliRunner

    from taskrun.runner.cli import main

    env = {"TASKRUN_MODELS_TOML": str(toml), "EVAL_KEY": key}
    r = CliRunner().invoke(main, ["eval", str(cases_file), *args, "--json"], env=env, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert KEY not in r.output
    return json.loads(r.stdout)


def texts(out: dict, setup: str) -> dict:
    return {cid: tries[0]["text"] for cid, tries in out["cases"][setup].items()}


def test_eval_local_openai_and_ollama_give_the_same_text_and_known_outcomes(served, cases_file):
    from taskrun.runner.runlog.store import RunLog

    server, toml, _ = served
    # the random tiny model never ends an answer itself; a stop text it writes ("6") ends two of
    # the three (measured: "any" and "sys" hold a 6 in their first 12 tokens, "never" does not)
    opts = "max_tokens=12,temperature=0,stop=6"
    setups = [
        f"tiny-llama@{opts}",
        f"openai:{server.url}/v1#tiny-llama@{opts},api_key_env=EVAL_KEY",
        f"ollama:{server.url}#tiny-llama@{opts},api_key_env=EVAL_KEY",
        "tiny-llama@max_tokens=1,temperature=0",  # cut at one token: every answer incomplete
    ]
    out = eval_json(toml, cases_file, *[a for s in setups for a in ("--setup", s)], "--attempts", "2")
    local, oa, ol, cut = (out["setups"][s] for s in setups)
    assert texts(out, setups[0]) == texts(out, setups[1]) == texts(out, setups[2])
    assert all(texts(out, setups[0]).values())
    for s in (local, oa, ol):  # "never" is cut at max_tokens twice; the others pass first try
        assert (s["accepted"], s["first_try"], s["attempts"], s["retries"], s["errors"]) == (2, 2, 4, 1, 0)
        assert s["incomplete"] == 2 and s["output_tokens"] > 0
        assert 0 <= s["ttft_p50_s"] <= s["completion_p95_s"]
    assert (cut["accepted"], cut["incomplete"], cut["attempts"]) == (0, 6, 6)
    assert [t["why"] for t in out["cases"][setups[3]]["any"]] == ["incomplete (length)"] * 2

    # one run-log row per attempt, all under the eval id; the table's sums are theirs
    rows = RunLog().recent(100, chain_id=out["eval_id"])
    assert len(rows) == sum(s["attempts"] for s in out["setups"].values()) == 18
    by_id = {r["id"]: r for r in rows}
    for name, per in out["cases"].items():
        mine = [by_id[t["row_id"]] for tries in per.values() for t in tries]
        assert sum(r["metrics"]["output_tokens"] for r in mine) == out["setups"][name]["output_tokens"]
        assert sum(r["metrics"]["input_tokens"] for r in mine) == out["setups"][name]["input_tokens"]
    ep = [by_id[t["row_id"]] for t in out["cases"][setups[1]]["any"]] + [
        by_id[t["row_id"]] for t in out["cases"][setups[2]]["any"]
    ]
    assert {r["runtime"] for r in ep} == {"endpoint:openai", "endpoint:ollama"}
    assert {r["model_path"] for r in ep} == {server.url + "/v1", server.url}
    assert all(r["model"] == "tiny-llama" and r["model_digest"] for r in ep)


def test_endpoint_client_reports_server_timings_apart(served):
    server, _, _ = served
    os.environ["EVAL_KEY"] = KEY
    try:
        ol = Endpoint.from_spec(f"ollama:{server.url}#tiny-llama", "EVAL_KEY").chat(
            [{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0
        )
        oa = Endpoint.from_spec(f"openai:{server.url}/v1#tiny-llama", "EVAL_KEY").chat(
            [{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0
        )
    finally:
        del os.environ["EVAL_KEY"]
    assert ol.text == oa.text and ol.output_tokens == oa.output_tokens > 0
    assert ol.server["eval_s"] > 0 and "usage" in oa.server and oa.server["usage"]["completion_tokens"] > 0
    assert 0 < ol.ttft_s <= ol.total_s and ol.digest and ol.model == "tiny-llama"


def test_a_wrong_key_is_a_clear_error_that_never_shows_a_key(served, cases_file):
    server, toml, _ = served
    out = eval_json(
        toml, cases_file, "--setup", f"openai:{server.url}/v1#tiny-llama@api_key_env=EVAL_KEY", key="sk-wrong-9c1d"
    )
    errors = [t["error"] for tries in next(iter(out["cases"].values())).values() for t in tries]
    assert all("HTTP 401" in e and server.url.removeprefix("http://") in e for e in errors)
    assert "sk-wrong" not in json.dumps(out)


def test_a_missing_key_variable_names_the_fix(served, cases_file, monkeypatch):
    server, toml, _ = served
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    out = eval_json(toml, cases_file, "--setup", f"openai:{server.url}/v1#tiny-llama@api_key_env=NO_SUCH_KEY")
    assert (
        "NO_SUCH_KEY: that environment variable is not set" in out["cases"][next(iter(out["cases"]))]["any"][0]["error"]
    )


def test_the_key_is_in_no_argv_output_or_log_file(served, cases_file, tmp_path):
    """`run eval` as a process: its argv (as ps shows every process) never holds the key, nor its
    stdout/stderr, nor the run-log file's bytes."""
    server, toml, _ = served
    log_db = tmp_path / "eval-runs.db"
    env = {**os.environ, "TASKRUN_MODELS_TOML": str(toml), "EVAL_KEY": KEY, "TASKRUN_LOG_DB": str(log_db)}
    setup = f"openai:{server.url}/v1#tiny-llama@max_tokens=4,api_key_env=EVAL_KEY"
    proc = subprocess.Popen(
        [RUN, "eval", str(cases_file), "--setup", setup], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    seen = []
    while proc.poll() is None:
        seen.append(subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout)
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    assert any(setup in s for s in seen)  # ps did see the eval running
    assert not any(KEY in s for s in seen)
    assert KEY.encode() not in stdout + stderr and b"accepted" in stdout
    assert log_db.stat().st_size > 0 and KEY.encode() not in log_db.read_bytes()


def test_llama_cpp_server_answers_as_the_local_gguf(served, cases_file, tmp_path):
    """llama-cpp-python's own OpenAI server on the tiny GGUF vs taskrun's llama.cpp engine on it."""
    pytest.importorskip("llama_cpp.server.app", reason="pip install 'llama-cpp-python[server]' (dev extras)")
    from tests.serve_helpers import free_port

    _, toml, aliases = served
    port = free_port()
    log = open(tmp_path / "llama-server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", aliases["tiny-gguf"]["local"], "--host", "127.0.0.1"]
        + ["--port", str(port), "--model_alias", "tiny-gguf", "--n_ctx", "512"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "llama-server.log").read_text()
            time.sleep(0.2)
        setups = ["tiny-gguf@max_tokens=10,temperature=0", f"openai:http://127.0.0.1:{port}/v1#tiny-gguf@max_tokens=10"]
        out = eval_json(toml, cases_file, *[a for s in setups for a in ("--setup", s)])
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
    # the random model writes stray byte pieces: llama.cpp's server drops a broken UTF-8 piece where
    # the local engine writes U+FFFD, so the comparison leaves those out. Only the case without a
    # system message is compared: on "sys" the two differ (the server's template handling; not yet
    # looked into), and "never" parts after a run of broken pieces.
    local, remote = (texts(out, s)["any"].replace("\ufffd", "") for s in setups)
    assert local == remote and local
    assert (out["setups"][setups[1]]["errors"], out["setups"][setups[1]]["incomplete"]) == (0, 3)  # no stop text


def test_eval_json_keeps_full_precision(served, cases_file):
    """`--json` is for programs: floats keep every digit (6-decimal rounding is for the table), so a
    sub-microdollar cost per accepted answer or a completion time is not cut to 6 decimals."""
    _, toml, _ = served
    out = eval_json(toml, cases_file, "--setup", "tiny-llama@max_tokens=2,temperature=0")
    times = [t["completion_s"] for tries in next(iter(out["cases"].values())).values() for t in tries]
    assert times and any(round(x, 6) != x for x in times)  # perf_counter spans carry > 6 decimals


def test_each_setup_says_what_answered(served, cases_file):
    """The report names what answered each setup: a local one's runtime, device, dtype, digest and
    the engine's notes (on llama.cpp, which CPU kernels ran: they word greedy answers differently
    at near ties), an endpoint's URL and the model it reported. The table prints it as `ran` lines."""
    from click.testing import CliRunner

    from taskrun.runner.cli import main

    server, toml, aliases = served
    setups = [
        "tiny-llama@max_tokens=4,temperature=0",
        f"openai:{server.url}/v1#tiny-llama@max_tokens=4,api_key_env=EVAL_KEY",
    ]
    if "tiny-gguf" in aliases:
        setups.append("tiny-gguf@max_tokens=4,temperature=0")
    out = eval_json(toml, cases_file, *[a for s in setups for a in ("--setup", s)])
    local, endpoint = out["setups"][setups[0]]["ran"], out["setups"][setups[1]]["ran"]
    assert len(local) == 1 and local[0].startswith("transformers, cpu, ") and "sha256:" in local[0]
    assert endpoint == [f"endpoint:openai {server.url}/v1, model tiny-llama"]
    assert all(t["ran"] == local[0] for tries in out["cases"][setups[0]].values() for t in tries)
    if "tiny-gguf" in aliases:
        (gguf,) = out["setups"][setups[2]]["ran"]
        assert gguf.startswith("llama.cpp, cpu, ") and "; llama.cpp CPU kernels: " in gguf
    env = {"TASKRUN_MODELS_TOML": str(toml), "EVAL_KEY": KEY}
    r = CliRunner().invoke(main, ["eval", str(cases_file), "--setup", setups[0]], env=env, catch_exceptions=False)
    assert f"ran [1] {setups[0]}: {local[0]}" in r.stdout
