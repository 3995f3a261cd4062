"""Chains: files checked before anything loads, one logged job per stage, artifacts on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.chains.run import check_chain, load_chain, parse_chain
from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from taskrun.tasks.base import TaskError
from tests.tiny.generate import build

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _chain(tmp_path, body: str) -> str:
    f = tmp_path / "c.toml"
    f.write_text(body)
    return str(f)


def test_shipped_chains_are_well_formed():
    for name in ("meeting-notes", "ask-docs"):
        chain = load_chain(name)
        check_chain(chain)
    assert [s.task for s in load_chain("meeting-notes").steps] == ["transcribe", "summarize"]
    assert [s.task for s in load_chain("ask-docs").steps] == ["search", "generate"]


def test_unknown_chain_names_the_known_ones():
    with pytest.raises(TaskError, match="no chain named 'nope'.*meeting-notes"):
        load_chain("nope")


def test_unknown_step_is_refused_before_anything_loads(tmp_path):
    path = _chain(tmp_path, 'inputs = { text = "text" }\n[[steps]]\ntask = "translate"\ninput = "text"\n')
    r = CliRunner().invoke(main, ["chain", path, "hello"])
    assert r.exit_code != 0 and "step 1 (translate) names an unknown task" in r.output, r.output


def test_mismatched_steps_are_refused_before_anything_loads(tmp_path):
    body = (
        'inputs = { notes = "text" }\n'
        '[[steps]]\ntask = "summarize"\ninput = "notes"\noutput = "summary"\n'
        '[[steps]]\ntask = "transcribe"\ninput = "summary"\n'
    )
    r = CliRunner().invoke(main, ["chain", _chain(tmp_path, body), "some notes"])
    assert r.exit_code != 0, r.output
    assert "step 2 (transcribe) takes" in r.output and "'summary' (text, from the summarize step)" in r.output
    assert RunLog().count() == 0  # nothing ran


def test_undefined_input_and_bad_options_are_caught(tmp_path):
    chain = parse_chain({"inputs": {"q": "text"}, "steps": [{"task": "generate", "input": "answer"}]})
    with pytest.raises(TaskError, match="reads 'answer', which no earlier step outputs"):
        check_chain(chain)
    chain = parse_chain(
        {"inputs": {"q": "text"}, "steps": [{"task": "generate", "input": "q", "options": {"max_tokens": 0}}]}
    )
    with pytest.raises(TaskError, match="step 1 \\(generate\\): --max-tokens must be at least 1"):
        check_chain(chain, {"q": "hi"})
    with pytest.raises(TaskError, match="unknown key"):
        parse_chain({"inputs": {"q": "text"}, "steps": [{"task": "generate", "input": "q", "bogus": 1}]})


def test_wrong_number_of_inputs(tmp_path):
    r = CliRunner().invoke(main, ["chain", "ask-docs", "only a question"])
    assert r.exit_code != 0 and "takes 2 input(s): QUESTION DOCS" in r.output


def test_chain_runs_each_stage_as_a_linked_job(tiny_dir, tmp_path):
    model = build(tiny_dir)
    body = (
        f'inputs = {{ topic = "text" }}\n'
        f'[[steps]]\ntask = "generate"\ninput = "topic"\noutput = "draft"\nmodel = "{model}"\n'
        f"options = {{ max_tokens = 12, seed = 1 }}\n"
        f'[[steps]]\ntask = "summarize"\ntemplate = "Notes on {{topic}}:\\n{{draft}}"\noutput = "summary"\n'
        f'model = "{model}"\nartifact = "summary.txt"\noptions = {{ max_tokens = 6 }}\n'
    )
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["chain", _chain(tmp_path, body), "the release", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert [s["task"] for s in doc["stages"]] == ["generate", "summarize"]
    assert doc["wall_s"] >= sum(s["metrics"]["wall_s"] for s in doc["stages"]) * 0.99
    rows = RunLog().recent(10, chain_id=doc["chain_id"])
    assert sorted((row["stage"], row["task"]) for row in rows) == [(0, "generate"), (1, "summarize")]
    assert (out / "1-draft.txt").read_text().strip() == doc["stages"][0]["items"][0]["result"]["text"].strip()
    assert (out / "summary.txt").exists() and (out / "chain.json").exists()


@pytest.mark.real
def test_meeting_notes_on_a_real_clip(tmp_path):
    import soundfile as sf

    audio, sr = sf.read(str(SAMPLES / "meeting.wav"))
    clip = tmp_path / "clip.wav"
    sf.write(clip, audio[: int(sr * 13)], sr)  # the first two sentences
    out = tmp_path / "notes"
    r = CliRunner().invoke(main, ["chain", "meeting-notes", str(clip), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    transcript = (out / "transcript.txt").read_text()
    assert "dashwood" in transcript.lower()
    summary = doc["stages"][1]["items"][0]["result"]["text"]
    assert summary.strip() and (out / "summary.txt").read_text().strip() == summary.strip()
    rows = RunLog().recent(10, chain_id=doc["chain_id"])
    assert sorted((row["stage"], row["task"], row["status"]) for row in rows) == [
        (0, "transcribe", "ok"),
        (1, "summarize", "ok"),
    ]


@pytest.mark.real
def test_ask_answers_from_the_docs_with_sources(tmp_path):
    r = CliRunner().invoke(
        main,
        [
            "ask",
            "How many parameters does the Whisper tiny model have?",
            "--docs",
            str(SAMPLES / "docs"),
            "-o",
            str(tmp_path / "ask"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "39 million" in r.stdout and "Sources:" in r.stdout and "whisper.md" in r.stdout
    assert (tmp_path / "ask" / "passages.txt").read_text().startswith("[1]")
