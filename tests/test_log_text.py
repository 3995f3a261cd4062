"""The run log keeps the texts of a job (prompt and answer, text and summary, transcript) unless
told not to, and `run logs --search` finds runs by them (SQLite FTS5). Tiny random models."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog import store as runlog
from taskrun.runner.runlog.store import RunLog
from tests.tiny import generate as tiny_generate
from tests.tiny import models_toml_with
from tests.tiny import summarize as tiny_summarize
from tests.tiny import transcribe as tiny_transcribe

CASES = {"generate": tiny_generate, "summarize": tiny_summarize, "transcribe": tiny_transcribe}


def invoke(*args, input=None):
    r = CliRunner().invoke(main, [str(a) for a in args], input=input)
    return r


def job(task: str, tiny_dir, *prefix: str, extra=(), input_text=None):
    case = CASES[task].case(tiny_dir)
    args = input_text and [input_text] or case.args
    r = invoke(*prefix, task, *args, "--model", case.model, *case.options, *extra, "--json", "-q")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("task", sorted(CASES))
def test_texts_are_kept_for_text_tasks(task, tiny_dir):
    out = job(task, tiny_dir)
    texts = RunLog().texts(out["id"])
    answer = out["items"][0]["result"]["text"]
    outputs = [t["text"] for t in texts if t["role"] == "output"]
    assert outputs == ([answer] if answer else [])
    inputs = [t["text"] for t in texts if t["role"] == "input"]
    if task == "transcribe":
        assert inputs == []  # audio: only the transcript is text
        assert answer, "the tiny whisper gave no text: the test would prove nothing"
    else:
        assert inputs == [CASES[task].case(tiny_dir).args[0]]
    shown = json.loads(invoke("logs", "show", out["id"]).stdout)
    assert shown["texts"] == texts


def test_embed_inputs_are_not_kept(tiny_dir):
    from tests.tiny.bert import build

    r = invoke("embed", "a private sentence", "--model", build(tiny_dir), "--json", "-q")
    assert r.exit_code == 0, r.output
    assert RunLog().texts(json.loads(r.stdout)["id"]) == []


@pytest.mark.parametrize("how", ["global flag", "command flag", "env", "config"])
def test_no_log_text_keeps_no_text(how, tiny_dir, tmp_path, monkeypatch):
    prefix, extra = (), ()
    if how == "global flag":
        prefix = ("--no-log-text",)
    elif how == "command flag":
        extra = ("--no-log-text",)
    elif how == "env":
        monkeypatch.setenv("TASKRUN_LOG_TEXT", "0")
    else:
        toml = models_toml_with({}, tmp_path)
        toml.write_text(toml.read_text() + "\n[log]\ntext = false\n")
        monkeypatch.setenv("TASKRUN_MODELS_TOML", str(toml))
    out = job("generate", tiny_dir, *prefix, extra=(*extra, "--system", "a walrus rule"), input_text="the zebra secret")
    assert RunLog().texts(out["id"]) == []
    row = RunLog().get(out["id"])
    assert row["status"] == "ok" and row["metrics"]["output_tokens"] > 0  # the row itself is kept
    assert row["summary"] == "(text not logged)" and row["options"]["system"] == "(text not logged)"
    log = Path(os.environ["TASKRUN_LOG_DB"])
    stored = b"".join(p.read_bytes() for p in log.parent.glob(log.name + "*"))  # the file, its WAL
    answer = out["items"][0]["result"]["text"]
    for secret in ("zebra", "walrus", *([answer[:12]] if len(answer) >= 6 else [])):
        assert secret.encode() not in stored, secret
    assert runlog.text_override is None  # the flag does not outlive its command
    again = job("generate", tiny_dir, input_text="the zebra secret") if how.endswith("flag") else None
    if again:
        assert RunLog().texts(again["id"]), "the next command keeps texts again"


def test_search_finds_runs_by_their_prompt(tiny_dir):
    first = job("generate", tiny_dir, input_text="What is the capital of Zanzibar?")
    job("generate", tiny_dir, input_text="Count the apples")
    r = invoke("logs", "--search", "capital zanzibar?", "--json")
    assert r.exit_code == 0, r.output
    assert [row["id"] for row in json.loads(r.stdout)] == [first["id"]]
    assert json.loads(invoke("logs", "--search", "capital apples", "--json").stdout) == []  # every word
    text = invoke("logs", "--search", "Zanzibar")
    assert first["id"] in text.stdout
    none = invoke("logs", "--search", "nowhere-to-be-found")
    assert none.exit_code == 0 and "no runs found" in none.stderr


def test_search_finds_answers_too(tiny_dir):
    out = job("generate", tiny_dir)
    answer = out["items"][0]["result"]["text"]
    words = re.findall(r"\w{3,}", answer)  # whole words, as the index splits them
    assert words, f"the tiny model's answer {answer!r} has no word to search for"
    word = words[0]
    found = json.loads(invoke("logs", "--search", word, "--json").stdout)
    assert out["id"] in [row["id"] for row in found]


def _rows(n_texts: dict[str, str], log: RunLog) -> None:
    for run_id, text in n_texts.items():
        log.append(
            {
                "id": run_id,
                "started_at": "2026-01-01T00:00:00",
                "task": "generate",
                "status": "ok",
                "texts": [(0, "input", text)],
            }
        )


def test_without_fts5_search_falls_back_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runlog, "_has_fts5", lambda db: False)
    log = RunLog(tmp_path / "plain.db")
    assert not log.fts
    _rows({"a": "the quick brown fox", "b": "a lazy dog"}, log)
    assert [r["id"] for r in log.search("QUICK fox")] == ["a"]
    assert "no FTS5" in capsys.readouterr().err
    # the same log opened where FTS5 exists gets its index, with the texts logged before it
    monkeypatch.undo()
    again = RunLog(tmp_path / "plain.db")
    assert again.fts and [r["id"] for r in again.search("lazy")] == ["b"]


def test_fts_query_treats_operators_and_quotes_as_text(tmp_path):
    log = RunLog(tmp_path / "q.db")
    _rows({"a": 'say "NOT" AND (near) OR-else', "b": "plain words"}, log)
    assert [r["id"] for r in log.search('"NOT" AND (near')] == ["a"]
    assert log.search("   ") == [] and log.search("*") == []


def test_texts_table_is_migration_5_and_old_logs_upgrade(tmp_path):
    path = tmp_path / "v3.db"
    db = sqlite3.connect(path)
    db.executescript(";".join(runlog.MIGRATIONS[:3]) + "; PRAGMA user_version = 3;")
    db.execute("INSERT INTO runs (id, started_at, task, status) VALUES ('old', '2025', 'generate', 'ok')")
    db.commit()
    db.close()
    log = RunLog(path)
    assert log.version() == len(runlog.MIGRATIONS) == 5
    _rows({"new": "hello there"}, log)
    assert [r["id"] for r in log.search("hello")] == ["new"]
    assert log.get("old")["status"] == "ok"


def test_batch_and_server_jobs_keep_texts_the_same_way(tiny_dir, tmp_path):
    """The server's worker and the batch runner wrap the log (CapturingLog, LogTap) and run jobs
    through run_job: the texts still reach the log, and the wrappers see both rows of a job."""
    from taskrun.runner.batch.work import LogTap
    from taskrun.runner.jobs import run_spec
    from taskrun.runner.serve.workers import CapturingLog
    from taskrun.tasks.base import Input
    from taskrun.tasks.wire.jobspec import JobSpec

    model = str(tiny_generate.build(tiny_dir))
    for i, wrap in enumerate((CapturingLog, LogTap)):
        spec = JobSpec(
            task="generate",
            inputs=[Input(source="request", kind="text", text=f"orbit{i} moon")],
            options={"max_tokens": 4},
            model=model,
            runtime=None,
            id=None,
        )
        rec = run_spec(spec, log=wrap(RunLog()), device="cpu", dtype="auto", offline=True)
        assert [r["id"] for r in RunLog().search(f"orbit{i}")] == [rec.id]
        assert RunLog().get(rec.id)["status"] == "ok"


def test_batch_command_keeps_texts(tiny_dir, tmp_path):
    model = str(tiny_generate.build(tiny_dir))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        json.dumps(
            {"id": "j1", "task": "generate", "input": "a walrus sings", "options": {"max_tokens": 4}, "model": model}
        )
        + "\n"
    )
    r = invoke("batch", str(jobs), "-o", str(tmp_path / "out.jsonl"), "-q")
    assert r.exit_code == 0, r.output
    found = RunLog().search("walrus")
    assert len(found) == 1 and found[0]["task"] == "generate"


def test_chat_turns_keep_their_texts(tiny_dir):
    model = str(tiny_generate.build(tiny_dir))
    r = invoke("chat", "--model", model, "--max-tokens", "4", "-q", input="hello pelican\nand the otter?\n")
    assert r.exit_code == 0, r.output
    turns = RunLog().search("otter")
    assert len(turns) == 1 and turns[0]["task"] == "generate"
    assert [t["text"] for t in RunLog().texts(turns[0]["id"]) if t["role"] == "input"] == ["and the otter?"]
    assert len(RunLog().search("pelican")) == 1  # each turn keeps its own words, not the history's
    hidden = invoke("--no-log-text", "chat", "--model", model, "--max-tokens", "4", "-q", input="a heron\n")
    assert hidden.exit_code == 0 and RunLog().search("heron") == []
