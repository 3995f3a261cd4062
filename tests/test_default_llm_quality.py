"""The default language model on real text (issue 32): answers a user can use.

Marked ``real``: they load the packaged Qwen2.5-Coder-1.5B (1.1 GB), so they are few. Each checks
what SmolLM2-135M got wrong: a name given in chat turn 1, a summary that keeps every fact of a
written meeting note, and summaries that add no name or number that is not in their input.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main

pytestmark = pytest.mark.real

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
WORDS = {n: w for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def _numbers(text: str) -> set[str]:
    """The numbers a text states, as digits without separators ("42,000" -> "42000")."""
    return {m.replace(",", "").rstrip(".") for m in re.findall(r"\d[\d,.]*", text)}


def invented(summary: str, source: str) -> list[str]:
    """Numbers and capitalised words of ``summary`` that ``source`` does not have (a number
    spelled out in the source counts: "six weeks" -> "6 weeks", and so does a 12-hour clock time)."""
    low = source.lower()
    have = _numbers(source) | {str(n) for n, w in WORDS.items() if re.search(rf"\b{w}\b", low)}
    have |= {str(int(h) % 12 or 12) for h in re.findall(r"\b(\d{1,2}):\d\d\b", source)}  # 19:00 -> "7 PM"
    out = [n for n in _numbers(summary) if n not in have and not any(n in h for h in have)]
    for word in re.findall(r"\b[A-Z][a-z]{2,}\b", summary):
        if word.lower() not in low and word not in _ALLOWED:
            out.append(word)
    return out


# words a summary may add without inventing a fact: its own framing
_ALLOWED = {"Summary", "Key", "Points", "Decisions", "Attendees", "Meeting", "Overall", "Additionally", "They", "This"}


def test_chat_remembers_a_name_from_turn_one():
    r = CliRunner().invoke(
        main, ["chat", "--temperature", "0"], input="My name is Ada and I like green tea.\nWhat is my name?\n"
    )
    assert r.exit_code == 0, r.output
    answers = [line for line in r.stdout.splitlines() if line.strip()]
    assert "Ada" in answers[-1], r.stdout


def test_summary_of_a_written_meeting_note_keeps_every_fact(tmp_path):
    note = (SAMPLES / "council-note.txt").read_text()
    # --length long asks for every fact; the default (medium, one short paragraph) keeps the amount,
    # the street and who voted against, but drops the vote count and the meeting's date
    args = ["summarize", str(SAMPLES / "council-note.txt"), "--length", "long", "--temperature", "0", "--json", "-q"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)["items"][0]["result"]["text"]
    low = summary.lower()
    facts = {
        "the amount": "42,000" in summary or "42000" in summary,
        "the street": "harbour street" in low,
        "the vote": re.search(r"\b3\b|three", low) and re.search(r"\b1\b|one", low) and "against" in low,
        "who voted against": "becker" in low,
        "the mayor": "ortiz" in low,
        "the meeting's date": "14 march" in low or "march 14" in low,
        "the library's Saturdays": "saturday" in low and ("1 april" in low or "april 1" in low),
        "the works' start": "2 may" in low or "may 2" in low,
        "the clerk": "okafor" in low,
        "the next meeting": "11 april" in low or "april 11" in low,
    }
    assert all(facts.values()), ([k for k, v in facts.items() if not v], summary)
    assert not invented(summary, note), (invented(summary, note), summary)


def test_meeting_notes_chain_on_the_sample_recording_keeps_its_name_and_invents_nothing(tmp_path):
    out = tmp_path / "notes"
    r = CliRunner().invoke(main, ["chain", "meeting-notes", str(SAMPLES / "meeting.wav"), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    transcript = (out / "transcript.txt").read_text()
    summary = doc["stages"][1]["items"][0]["result"]["text"]
    low = summary.lower()
    assert "dashwood" in low, summary  # the one name said
    # Not asserted, as the 1.5B's medium summary drops them (measured 2026-12-02, twice): "go forward
    # ten meters" and the playing cards (one run kept "clubs and spades", the next neither). The
    # recording is three unrelated readings; what is asserted is that nothing is invented.
    assert not invented(summary, transcript), (invented(summary, transcript), summary)
