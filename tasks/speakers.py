"""RTTM, the diarization format (NIST Rich Transcription Time Marked): who spoke when, one line per
stretch of one voice. Written from a transcript's speaker-labelled segments (transcribe --speakers)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from taskrun.tasks.base import TaskError

JOIN_S = 0.5  # consecutive segments of one voice closer than this are one RTTM turn


def to_rttm(source: str, segments: list[Any]) -> str:
    """NIST RTTM: one SPEAKER line per stretch of one voice (consecutive segments joined)."""
    if segments and not any(s.speaker for s in segments):
        raise TaskError("RTTM says who spoke: add --speakers to write it")
    uri = PurePath(source).stem.replace(" ", "_") or "audio"
    lines, cur = [], None
    for s in segments:
        if s.speaker is None:
            continue
        if cur and cur[2] == s.speaker and s.start - cur[1] < JOIN_S:
            cur[1] = s.end
            continue
        if cur:
            lines.append(cur)
        cur = [s.start, s.end, s.speaker]
    if cur:
        lines.append(cur)
    return "".join(f"SPEAKER {uri} 1 {a:.3f} {b - a:.3f} <NA> <NA> {lab} <NA> <NA>\n" for a, b, lab in lines)
