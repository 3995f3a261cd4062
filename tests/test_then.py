"""`--then`: the short form of a two-stage chain, e.g. `run transcribe x.wav --then summarize`."""

from __future__ import annotations

import json

from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.tiny import generate as tiny_llm
from tests.tiny import search as tiny_search
from tests.tiny import transcribe as tiny_asr


def test_search_then_summarize_logs_two_linked_stages(tiny_dir):
    s, g = tiny_search.case(tiny_dir), tiny_llm.case(tiny_dir)
    r = CliRunner().invoke(
        main, ["search", *s.args, "--model", s.model, *s.options, "--json", "-q", "--then", f"summarize={g.model}"]
    )
    assert r.exit_code == 0, r.output
    jobs = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [j["task"] for j in jobs] == ["search", "summarize"]
    assert jobs[0]["chain_id"] == jobs[1]["chain_id"] and [j["stage"] for j in jobs] == [0, 1]
    assert "cat sat" in jobs[1]["items"][0]["input"] or jobs[1]["items"][0]["input"].startswith("search of")
    rows = RunLog().recent(10, chain_id=jobs[0]["chain_id"])
    assert sorted(r["stage"] for r in rows) == [0, 1] and all(r["status"] == "ok" for r in rows)
    assert "ttft_s" in jobs[1]["metrics"] and "ttft_s" not in jobs[0]["metrics"]


def test_transcribe_then_summarize_on_tiny_models(tiny_dir):
    a, g = tiny_asr.case(tiny_dir), tiny_llm.case(tiny_dir)
    r = CliRunner().invoke(
        main,
        [
            "transcribe",
            *a.args,
            "--model",
            a.model,
            "--runtime",
            a.runtime,
            "--json",
            "-q",
            "--then",
            f"summarize={g.model}",
        ],
    )
    jobs = [json.loads(line) for line in r.stdout.strip().splitlines() if line.startswith("{")]
    assert jobs[0]["task"] == "transcribe" and "rtf" in jobs[0]["metrics"]
    if jobs[0]["items"][0]["result"]["text"].strip():
        assert r.exit_code == 0, r.output
        assert jobs[1]["task"] == "summarize" and "rtf" not in jobs[1]["metrics"]
    else:  # a random tiny model may hear nothing: the chain must say so, not summarise nothing
        assert r.exit_code == 1 and "produced no text" in r.output


def test_then_refuses_a_task_that_cannot_take_the_output_before_loading(tiny_dir):
    s = tiny_search.case(tiny_dir)
    r = CliRunner().invoke(main, ["search", *s.args, "--model", s.model, *s.options, "--then", "detect"])
    assert r.exit_code == 1 and "search cannot feed detect" in r.output
    r = CliRunner().invoke(main, ["search", *s.args, "--model", s.model, *s.options, "--then", "nosuch"])
    assert r.exit_code == 1 and "no task named 'nosuch'" in r.output
