"""tools/wer.py: Whisper's English normaliser, so spelling and form differences are not errors."""

from __future__ import annotations

from tools.wer import wer, words_of


def test_spelling_hyphens_titles_and_numbers_are_not_errors():
    ref = "he was counselled by mister dashwood the fat mutton man ten of clubs"
    hyp = "He was counseled by Mr. Dashwood, the fat-mutton man. 10 of clubs."
    assert wer(ref, hyp) == 0.0
    assert wer("five five", "5 5.") == 0.0  # the normaliser alone makes "55" of one and "5 5" of the other
    assert wer("eight of spades four of clubs", "8 of spades, 4 of clubs.") == 0.0


def test_real_errors_still_count():
    assert wer("go forward ten meters", "go forward two meters") == 0.25
    assert wer("go forward ten meters", "go forward") == 0.5
    assert words_of("Colour, honour!") == ["color", "honor"]
