"""`run eval`'s paths beyond tests/test_eval.py: --concurrency (the same answers as one at a time),
--min-accept's exit status, the judge check with the packaged MiniLM, and a TOML setups file with
prices whose costs are checked against the run-log rows. Offline: the tiny Llama built in code, a
fake OpenAI-compatible server on loopback (tests/fake_openai.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.fake_openai import fake_server

CASES = [
    {"id": "a", "prompt": "What is the capital of France?", "not_contains": "qqqzzz"},
    {"id": "b", "prompt": "Count from one to ten.", "not_contains": "qqqzzz"},
    {"id": "c", "system": "Answer in one word.", "prompt": "The capital of France?", "not_contains": "qqqzzz"},
    {"id": "d", "prompt": "Name a colour.", "contains": "qqqzzz"},
]


@pytest.fixture
def env(tmp_path, tiny_dir):
    from tests.serve_helpers import models_toml
    from tests.tiny.generate import build

    toml = models_toml({"tiny-llama": {"local": str(build(tiny_dir))}}, tmp_path)
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(c) + "\n" for c in CASES))
    return {"TASKRUN_MODELS_TOML": str(toml), "TASKRUN_LOG_DB": str(tmp_path / "runs.db")}, cases


def run_eval(env, cases, *args, code=0) -> dict:
    r = CliRunner().invoke(main, ["eval", str(cases), *args, "--json"], env=env, catch_exceptions=False)
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


def answers(out: dict, setup: str) -> dict:
    return {cid: [t["text"] for t in tries] for cid, tries in out["cases"][setup].items()}


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_dir, session_cache):
    from tests.serve_helpers import Server, models_toml, server_env
    from tests.tiny.generate import build

    folder = tmp_path_factory.mktemp("eval-paths-serve")
    toml = models_toml({"tiny-llama": {"local": str(build(tiny_dir))}}, folder)
    server = Server(folder, server_env(folder, session_cache, toml), "--preload", "tiny-llama")
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def test_concurrency_gives_the_answers_of_one_at_a_time(env, served):
    e, cases = env
    # the random tiny model never ends an answer itself; the stop text "6" (measured) ends a and c
    local = "tiny-llama@max_tokens=10,temperature=0,stop=6"  # before the fix, 4 threads on one model gave other text
    remote = f"openai:{served.url}/v1#tiny-llama@max_tokens=10,temperature=0,stop=6"
    args = ("--setup", local, "--setup", remote, "--attempts", "2")
    one = run_eval(e, cases, *args)
    four = run_eval(e, cases, *args, "--concurrency", "4")
    for setup in (local, remote):
        assert answers(one, setup) == answers(four, setup)
        assert all(t for tries in answers(one, setup).values() for t in tries)
        timing = ("ttft_p50_s", "ttft_p95_s", "completion_p50_s", "completion_p95_s", "output_tokens_per_s", "time_s")
        same = [
            {k: v for k, v in o["setups"][setup].items() if k not in timing and "per_accepted" not in k}
            for o in (one, four)
        ]
        assert same[0] == same[1]
        assert (same[0]["accepted"], same[0]["attempts"], same[0]["incomplete"]) == (2, 6, 4)  # b and d cut twice
    assert answers(one, local) == answers(one, remote)


def test_min_accept_sets_the_exit_status(env):
    e, cases = env
    with fake_server(answer="Paris") as (url, _):  # passes a, b, c; fails d: 75%
        ok = f"openai:{url}#fake"
        out = run_eval(e, cases, "--setup", ok, "--min-accept", "0.75")
        assert out["setups"][ok]["accept_rate"] == 0.75 and "1 of 1 setups at or above 75%" in out["verdict"]
        out = run_eval(e, cases, "--setup", ok, "--min-accept", "0.8", code=1)
        assert "no setup met the acceptance level 80%" in out["verdict"]
        cut = "tiny-llama@max_tokens=1,temperature=0"  # every answer cut at one token
        out = run_eval(e, cases, "--setup", ok, "--setup", cut, "--min-accept", "0.5")  # one setup above is enough
        assert out["setups"][cut]["accepted"] == 0 and out["setups"][cut]["incomplete"] == 4
        run_eval(e, cases, "--setup", cut, "--min-accept", "0.5", code=1)


def test_a_setups_file_prices_each_accepted_answer_as_the_rows_add_up(env, tmp_path):
    e, cases = env
    with fake_server(answer="Paris, of course", usage={"prompt_tokens": 7, "completion_tokens": 3}) as (url, _):
        setups = tmp_path / "setups.toml"
        setups.write_text(
            f"""
[[setup]]
name = "hosted"
endpoint = "openai:{url}#fake"
price_in = 2.0
price_out = 10.0

[[setup]]
name = "laptop"
model = "tiny-llama"
price_hour = 36.0
options = {{ max_tokens = 10, temperature = 0, stop = "6" }}
"""
        )
        out = run_eval(e, cases, "--setup", str(setups), "--attempts", "2")
    hosted, laptop = out["setups"]["hosted"], out["setups"]["laptop"]
    # hosted: the fixed answer passes a, b, c and fails d twice: 5 requests of 7 in, 3 out
    assert (hosted["accepted"], hosted["attempts"]) == (3, 5)
    assert hosted["cost"] == pytest.approx(5 * (7 * 2.0 + 3 * 10.0) / 1e6)
    assert hosted["cost_per_accepted"] == pytest.approx(hosted["cost"] / 3, abs=1e-6)  # --json keeps 6 decimals
    rows = {r["id"]: r for r in RunLog(e["TASKRUN_LOG_DB"]).recent(100, chain_id=out["eval_id"])}
    assert len(rows) == hosted["attempts"] + laptop["attempts"]
    for name, per in out["cases"].items():
        mine = [(t, rows[t["row_id"]]) for tries in per.values() for t in tries]
        if name == "hosted":  # tokens × price, from the rows' tokens
            cost = sum(
                (r["metrics"]["input_tokens"] * 2.0 + r["metrics"]["output_tokens"] * 10.0) / 1e6 for _, r in mine
            )
        else:  # $/hour × the time each attempt took, load left out
            cost = sum((r["metrics"]["wall_s"] - r["metrics"]["load_s"]) * 36.0 / 3600 for _, r in mine)
        assert out["setups"][name]["cost"] == pytest.approx(cost, rel=1e-3, abs=2e-6)
        assert sum(t["cost"] for t, _ in mine) == pytest.approx(out["setups"][name]["cost"], abs=1e-6 * len(mine))
    assert laptop["cost_per_accepted"] == pytest.approx(laptop["cost"] / laptop["accepted"], abs=1e-6)
    assert "cheapest per accepted answer" in out["verdict"]


@pytest.mark.real
def test_the_judge_accepts_a_paraphrase_and_rejects_an_unrelated_answer(tmp_path):
    from taskrun.runner.eval.judge import make_judge

    judge = make_judge()  # the packaged MiniLM
    ref = "The meeting was moved to Thursday afternoon."
    para, other = judge("They moved the meeting to Thursday afternoon.", ref), judge("Bananas are yellow.", ref)
    assert para > 0.8 > 0.3 > other
    cases = tmp_path / "judge.jsonl"
    rows = [
        {"id": "para", "prompt": "When is the meeting?", "judge": ref, "threshold": 0.8},
        {"id": "other", "prompt": "When is the meeting?", "judge": "Bananas are yellow.", "threshold": 0.8},
    ]
    cases.write_text("".join(json.dumps(c) + "\n" for c in rows))
    env = {"TASKRUN_LOG_DB": str(tmp_path / "runs.db")}
    with fake_server(answer="They moved the meeting to Thursday afternoon.") as (url, _):
        out = run_eval(env, cases, "--setup", f"openai:{url}#fake")
    per = out["cases"][f"openai:{url}#fake"]
    assert per["para"][0]["accepted"] and not per["other"][0]["accepted"]
    assert per["other"][0]["why"].startswith("similarity ")
