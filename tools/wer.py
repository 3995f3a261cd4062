"""Word error rate, the one measure the transcription tests and benchmark both use: both texts
through Whisper's English text normaliser (transformers' EnglishTextNormalizer with Whisper's
British→American spelling map, tools/whisper_english.json, from openai-whisper 20250625's
whisper/normalizers/english.json, MIT), so "fat-mutton" vs "fat mutton", "counselled" vs
"counseled", "Mr." vs "mister" and "ten" vs "10" are not counted as errors. Numerals 0-10 standing
alone are spelled out first: the normaliser joins "five five" into "55" but leaves "5 5" apart."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

SPELLINGS = Path(__file__).with_name("whisper_english.json")


@functools.cache
def _normaliser():
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer(json.loads(SPELLINGS.read_text()))


_NUMS = "zero one two three four five six seven eight nine ten".split()


def words_of(text: str) -> list[str]:
    """The words WER compares: Whisper's English normalisation, split on spaces."""
    text = re.sub(r"(?<![\w.,])(10|[0-9])(?!\w|[.,]\d)", lambda m: _NUMS[int(m.group(1))], text)
    return _normaliser()(text).split()


def wer(ref: str, hyp: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) ÷ reference words."""
    r, h = words_of(ref), words_of(hyp)
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(h) + 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
    return d[len(h)] / max(1, len(r))
