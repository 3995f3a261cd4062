"""Word error rate, the one measure the transcription tests and benchmark both use."""

from __future__ import annotations

import re

_NUMS = {
    "0": "zero",
    "1": "one",
    "2": "two",
    "3": "three",
    "4": "four",
    "5": "five",
    "6": "six",
    "7": "seven",
    "8": "eight",
    "9": "nine",
    "10": "ten",
}


def words_of(text: str) -> list[str]:
    """Lowercase words without punctuation; numerals as words and Mr. as mister, as the
    LibriVox and CMU references spell them."""
    text = text.lower().replace("mr.", "mister").replace("-", " ")
    return [_NUMS.get(w, w) for w in re.findall(r"[a-z0-9']+", text)]


def wer(ref: str, hyp: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) ÷ reference words."""
    r, h = words_of(ref), words_of(hyp)
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(h) + 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
    return d[len(h)] / max(1, len(r))
