"""Subtitles people can read: transcript words shaped into cues of at most ``max_line_count`` lines
of ``max_line_width`` characters that stay on screen at most ``max_cue_s`` seconds, as broadcast
subtitles are (about 42 characters, 2 lines) and as openai-whisper's writer shapes them.

Cues are cut at word boundaries using the words' own times (word timestamps) when the transcript
has them; a segment without them has its time shared among its words by their length, so the cuts
still fall between words, at estimated times. A cue also ends at a pause and after a sentence that
ends a segment, and each file of a batch starts a new cue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PAUSE_S = 1.5  # a silence this long between two words ends the cue: the next words are a new thought
SENTENCE_END = (".", "?", "!", "…", "。", "？", "！")


@dataclass(frozen=True)
class Timed:
    """A word on the file's timeline (from word timestamps, or estimated from its segment)."""

    start: float
    end: float
    text: str
    segment: int  # index of the segment it came from
    file: int = 0


@dataclass
class Cue:
    start: float
    end: float
    lines: list[list[Timed]]

    def text(self, underline: Timed | None = None) -> str:
        return "\n".join(
            " ".join(f"<u>{w.text}</u>" if w is underline else w.text for w in line) for line in self.lines
        )


def words_of(segments: Sequence[Any], file: int = 0) -> list[Timed]:
    """Every word of ``segments`` with a time: its own, or its share of the segment's time."""
    out: list[Timed] = []
    for k, seg in enumerate(segments):
        if seg.words:
            out += _glued(
                [Timed(w.start, max(w.end, w.start), _clean(w.word), k, file) for w in seg.words if _clean(w.word)],
                _clean(seg.text),
            )
            continue
        words = _clean(seg.text).split()
        total = sum(len(w) + 1 for w in words) or 1
        t, span = seg.start, max(seg.end - seg.start, 0.0)
        for w in words:
            step = span * (len(w) + 1) / total
            out.append(Timed(round(t, 3), round(t + step, 3), w, k, file))
            t += step
    return out


def _glued(words: list[Timed], text: str) -> list[Timed]:
    """Words the model wrote without a space between them ("ill" "-disposed", "don" "'t") made one
    word again, as the segment's text spells them: a cue must not show "ill -disposed"."""
    out: list[Timed] = []
    at = 0
    for w in words:
        found = text.find(w.text, at)
        if out and found == at and found > 0:  # it starts right where the previous word ended
            prev = out[-1]
            out[-1] = Timed(prev.start, max(prev.end, w.end), prev.text + w.text, prev.segment, prev.file)
        else:
            out.append(w)
        if found >= 0:
            at = found + len(w.text)
    return out


def _clean(text: str) -> str:
    """A cue's text: "-->" would read as a timing line, and a blank line would end the cue."""
    return " ".join(text.replace("-->", "->").split())


def _pieces(word: Timed, width: int) -> list[Timed]:
    """A word longer than a whole line (a URL, say) cut into line-long pieces sharing its time."""
    if len(word.text) <= width:
        return [word]
    parts = [word.text[i : i + width] for i in range(0, len(word.text), width)]
    step = (word.end - word.start) / len(parts)
    return [
        Timed(round(word.start + i * step, 3), round(word.start + (i + 1) * step, 3), p, word.segment, word.file)
        for i, p in enumerate(parts)
    ]


def shape(words: list[Timed], width: int, count: int, max_s: float) -> list[Cue]:
    """Words → cues, greedily: a word joins the current line while the line stays within
    ``width``, a new line while the cue has fewer than ``count``, else it starts a new cue; so does
    a word that would keep the cue on screen past ``max_s``, a pause, a new file, or a new segment
    after a sentence's end."""
    cues: list[Cue] = []
    cue: Cue | None = None
    prev: Timed | None = None
    for word in (p for w in words for p in _pieces(w, width)):
        if cue is None or prev is None or _breaks(cue, prev, word, count, width, max_s):
            cue = Cue(word.start, word.end, [[word]])
            cues.append(cue)
        elif len(_line(cue.lines[-1])) + 1 + len(word.text) <= width:
            cue.lines[-1].append(word)
        else:
            cue.lines.append([word])
        cue.end = min(max(word.end, cue.end), cue.start + max_s)
        prev = word
    return cues


def _line(words: list[Timed]) -> str:
    return " ".join(w.text for w in words)


def _breaks(cue: Cue, prev: Timed, word: Timed, count: int, width: int, max_s: float) -> bool:
    """Whether ``word`` must start a new cue rather than join ``cue``."""
    fits_line = len(_line(cue.lines[-1])) + 1 + len(word.text) <= width
    if not fits_line and len(cue.lines) >= count:
        return True
    if word.end - cue.start > max_s or word.start - prev.end > PAUSE_S or word.file != prev.file:
        return True
    return word.segment != prev.segment and prev.text.endswith(SENTENCE_END)


def highlighted(cues: list[Cue]) -> list[tuple[float, float, str]]:
    """Karaoke style, as openai-whisper's ``highlight_words``: each cue shown once per word, with
    the word being spoken underlined, and plain between words."""
    out: list[tuple[float, float, str]] = []
    for cue in cues:
        at = cue.start
        for w in (w for line in cue.lines for w in line):
            start, end = max(w.start, at), min(w.end, cue.end)
            if end <= start:
                continue
            if start > at:
                out.append((at, start, cue.text()))
            out.append((start, end, cue.text(underline=w)))
            at = end
        if at < cue.end:
            out.append((at, cue.end, cue.text()))
    return out


def cues_of(
    items: Sequence[Any], width: int, count: int, max_s: float, highlight: bool
) -> list[tuple[float, float, str]]:
    """(start, end, text) of every cue of a batch of transcripts played one after another."""
    words, offset = [], 0.0
    for f, tr in enumerate(items):
        words += [Timed(w.start + offset, w.end + offset, w.text, w.segment, f) for w in words_of(tr.segments, f)]
        offset += tr.audio_s
    cues = shape(words, width, count, max_s)
    return highlighted(cues) if highlight else [(c.start, c.end, c.text()) for c in cues]
