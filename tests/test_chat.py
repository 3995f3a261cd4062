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


def test_a_failed_turn_is_reported_and_the_chat_goes_on(tiny):
    huge = "word " * 2000  # more than the whole window
    r = _chat(tiny, f"{huge}\nHi there\n/nonsense\n")
    assert "error: " in r.stderr and "the prompt is" in r.stderr
    assert "unknown command '/nonsense'" in r.stderr
    assert [x["status"] for x in _turns()] == ["failed", "ok"]
    assert r.exit_code != 0 and "1 of 2 turns failed" in r.output
