"""`run chat` on the tiny random Llama: lines piped in are turns, each a logged generate job whose
history holds the earlier turns; /save, /reset, --load; the window keeps the newest turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.tiny.generate import build

RUN = str(Path(sys.executable).parent / "run")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(build(tiny_dir))


def _chat(tiny, stdin: str, *args):
    r = CliRunner().invoke(main, ["chat", "--model", tiny, "--max-tokens", "6", "--seed", "1", *args], input=stdin)
    return r


def _turns() -> list[dict]:
    """This test's generate jobs, oldest first."""
    return list(reversed(RunLog().recent(100, task="generate")))


def test_three_piped_turns_each_see_the_earlier_ones(tiny, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # the test's private log and cache come with os.environ
    p = subprocess.run(
        [RUN, "chat", "--model", tiny, "--max-tokens", "6", "--seed", "1", "--system", "Be brief."],
        input="Hi there\nWhat did I say?\nAnd before that?\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    rows = _turns()
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert [len(r["options"]["history"]) for r in rows] == [0, 2, 4]  # user + assistant per earlier turn
    assert rows[2]["options"]["history"][2][1] == "What did I say?"
    assert all(r["options"]["system"] == "Be brief." for r in rows)
    tokens = [r["metrics"]["input_tokens"] for r in rows]
    assert tokens[0] < tokens[1] < tokens[2]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("[") and "prompt +" in ln]
    assert len(lines) == 3 and all(r["id"] in ln for r, ln in zip(rows, lines))  # one numbers line per turn
    assert f"[{tokens[1]} prompt + " in lines[1]


def test_reset_clears_the_history_and_save_writes_the_conversation(tiny, tmp_path):
    saved = tmp_path / "conv.json"
    r = _chat(tiny, f"Hi there\nWhat did I say?\n/save {saved}\n/reset\nHi there\n/exit\nnever read\n")
    assert r.exit_code == 0, r.output
    rows = _turns()
    assert len(rows) == 3  # /exit ended it: the last line was not a turn
    assert [len(x["options"]["history"]) for x in rows] == [0, 2, 0]
    assert rows[2]["metrics"]["input_tokens"] == rows[0]["metrics"]["input_tokens"]  # no earlier turn in the prompt
    body = json.loads(saved.read_text())
    assert [t["role"] for t in body["turns"]] == ["user", "assistant"] * 2
    assert [t["content"] for t in body["turns"][::2]] == ["Hi there", "What did I say?"]
    assert body["turns"][1]["content"] == rows[1]["options"]["history"][1][1]  # the answer as the model wrote it


def test_load_resumes_a_saved_conversation(tiny, tmp_path):
    saved = tmp_path / "conv.json"
    saved.write_text(
        json.dumps(
            {
                "system": "Be brief.",
                "turns": [
                    {"role": "user", "content": "My name is Ada."},
                    {"role": "assistant", "content": "Hello Ada."},
                ],
            }
        )
    )
    r = _chat(tiny, "What is my name?\n", "--load", str(saved))
    assert r.exit_code == 0, r.output
    row = _turns()[-1]
    assert row["options"]["history"] == [["user", "My name is Ada."], ["assistant", "Hello Ada."]]
    assert row["options"]["system"] == "Be brief."
    saved.write_text("{}")
    r = _chat(tiny, "hi\n", "--load", str(saved))
    assert r.exit_code != 0 and "not a conversation saved by /save" in r.output


def test_the_oldest_turns_are_dropped_to_fit_the_window(tiny):
    long = " ".join(["The meeting decided to ship the release on Friday."] * 6)  # ~130 tokens a turn
    r = _chat(tiny, "\n".join([long] * 4) + "\n", "--max-tokens", "40")
    assert r.exit_code == 0, r.output
    assert "note: dropped the" in r.stderr and "512-token window" in r.stderr
    rows = _turns()
    assert all(x["metrics"]["input_tokens"] + 40 <= 512 for x in rows)
    assert len(rows[-1]["options"]["history"]) < 6  # not every earlier turn is kept


def test_a_long_loaded_conversation_is_fitted_in_linear_time(tiny, tmp_path, monkeypatch):
    """Issue 33 item 14: 2,000 saved turns printed nothing for 240 s, every dropped pair
    re-rendering and re-tokenising all the rest. Each pair is tokenised once now: counted here."""
    from taskrun.runner.commands import chat as chat_mod

    saved = tmp_path / "long.json"
    turns = [
        {"role": r, "content": f"{r} line {i} about the release"} for i in range(1000) for r in ("user", "assistant")
    ]
    saved.write_text(json.dumps({"system": "", "turns": turns}))
    calls = []
    real_engine = chat_mod.Chat._engine

    def counted(self):
        llm = real_engine(self)
        if not getattr(llm, "_counted", False):
            real = llm.prompt_ids
            llm.prompt_ids = lambda *a, **k: calls.append(1) or real(*a, **k)
            llm._counted = True
        return llm

    monkeypatch.setattr(chat_mod.Chat, "_engine", counted)
    r = _chat(tiny, "What was decided?\n", "--load", str(saved), "--max-tokens", "40")
    assert r.exit_code == 0, r.output
    assert "note: dropped the" in r.stderr and "oldest turns" in r.stderr
    row = _turns()[-1]
    assert row["metrics"]["input_tokens"] + 40 <= 512
    assert row["options"]["history"][-1] == ["assistant", "assistant line 999 about the release"]  # the newest kept
    assert len(calls) < 100, len(calls)  # the pairs that fit, once each, plus a few full renders


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"turns": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
        ('{"turns": [{"role": "user", "content": "hi \\ud800"}]}', "turn 1 holds a lone surrogate"),
    ],
)
def test_a_load_nested_deep_or_with_a_lone_surrogate_is_a_clear_error(tiny, tmp_path, text, message):
    saved = tmp_path / "bad.json"
    saved.write_text(text)
    r = _chat(tiny, "hi\n", "--load", str(saved))
    assert r.exit_code != 0 and message in r.output, r.output
    assert "internal error" not in r.output


def test_a_failed_turn_is_reported_and_the_chat_goes_on(tiny):
    huge = "word " * 2000  # more than the whole window
    r = _chat(tiny, f"{huge}\nHi there\n/nonsense\n")
    assert "error: " in r.stderr and "the prompt is" in r.stderr
    assert "unknown command '/nonsense'" in r.stderr
    assert [x["status"] for x in _turns()] == ["failed", "ok"]
    assert r.exit_code != 0 and "1 of 2 turns failed" in r.output
