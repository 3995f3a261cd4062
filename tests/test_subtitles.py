"""Subtitles people can read: cues of at most --max-line-count lines of --max-line-width characters
that stay at most --max-cue-s on screen, cut between words; karaoke-style --highlight-words; word
timestamps on the transformers runtime too. The files are read back with pysrt and webvtt-py.

A tiny random model's words are noise, so the shaping is tested on synthetic transcripts with word
times; one real end-to-end srt checks the limits on real speech (marked real)."""

from __future__ import annotations

import json
import re

import numpy as np
import pysrt
import pytest
import webvtt
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.tasks.base import TaskError, make_options
from taskrun.tasks.transcribe import TASK, Options, Segment, Transcript, Word, to_srt, to_vtt
from tests.tiny.whisper import SAMPLES, build, clip

LOREM = (
    "So the committee met again on Tuesday and, after a long and frankly exhausting debate about "
    "the budget for next year, decided that the new library wing would open in the spring. "
    "Nobody objected. The chair then thanked everyone for their patience and the meeting ended "
    "with coffee, cake and a short speech about the history of the town hall and its clock."
)


def synthetic(
    text: str = LOREM, seconds_per_word: float = 0.31, with_words: bool = True, sentences_per_segment: int = 1
) -> Transcript:
    """A transcript whose segments are sentences and whose words each take ``seconds_per_word``."""
    rng = np.random.default_rng(0)
    sentences = re.findall(r"[^.]+\.", text)
    segs, t = [], 0.4
    for i in range(0, len(sentences), sentences_per_segment):
        words, start = [], t
        for w in " ".join(sentences[i : i + sentences_per_segment]).split():
            d = seconds_per_word * float(rng.uniform(0.5, 1.5))
            words.append(Word(round(t, 3), round(t + d, 3), w, 0.9))
            t += d + 0.05
        segs.append(
            Segment(round(start, 3), round(t, 3), " ".join(w.word for w in words), tuple(words) if with_words else None)
        )
        t += 0.4
    return Transcript("x.wav", text, "en", round(t + 1, 3), segs)


def parsed(tmp_path, items, options, fmt):
    """(start_s, end_s, text) of each cue, read back by the subtitle library of the format."""
    path = tmp_path / f"s.{fmt}"
    path.write_text(to_srt(items, options) if fmt == "srt" else to_vtt(items, options), encoding="utf-8")
    if fmt == "srt":
        return [(s.start.ordinal / 1000, s.end.ordinal / 1000, s.text) for s in pysrt.open(str(path))]
    return [(seconds(c.start), seconds(c.end), c.raw_text) for c in webvtt.read(str(path))]


def seconds(stamp: str) -> float:
    """00:01:02.345 → 62.345 (webvtt-py's *_in_seconds are whole seconds)."""
    h, m, s = stamp.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def check_limits(cues, width, count, max_s):
    assert cues
    ends = [0.0]
    for start, end, text in cues:
        lines = text.split("\n")
        assert 1 <= len(lines) <= count, text
        assert all(0 < len(re.sub(r"</?u>", "", line)) <= width for line in lines), text
        assert 0 <= end - start <= max_s + 1e-3, (start, end, text)
        assert start >= ends[-1] - 1e-3  # in order, never overlapping
        ends.append(end)


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
@pytest.mark.parametrize("width,count,max_s", [(42, 2, 6.0), (20, 1, 2.5), (32, 3, 10.0)])
def test_cues_keep_the_limits_and_every_word_in_order(fmt, width, count, max_s, tmp_path):
    tr = synthetic()
    opts = make_options(Options, {"max_line_width": width, "max_line_count": count, "max_cue_s": max_s})
    cues = parsed(tmp_path, [tr], opts, fmt)
    check_limits(cues, width, count, max_s)
    assert " ".join(text.replace("\n", " ") for _, _, text in cues).split() == LOREM.split()
    starts = {w.start for s in tr.segments for w in s.words}
    assert all(round(a, 3) in starts for a, _, _ in cues)  # each cue begins where a word begins


def test_the_defaults_are_the_broadcast_convention(tmp_path):
    o = Options()
    assert (o.max_line_width, o.max_line_count, o.max_cue_s) == (42, 2, 6.0)
    old_style = max(len(s.text) for s in synthetic().segments)
    assert old_style > 84  # one cue per segment would have broken the limits
    check_limits(parsed(tmp_path, [synthetic()], None, "srt"), 42, 2, 6.0)


def test_a_sentence_end_or_a_pause_starts_a_new_cue(tmp_path):
    cues = parsed(tmp_path, [synthetic()], Options(), "srt")
    texts = [t.replace("\n", " ") for _, _, t in cues]
    assert any(t == "Nobody objected." for t in texts), texts  # a short sentence is not merged on


def test_without_word_times_cuts_still_fall_between_words(tmp_path):
    tr = synthetic(with_words=False, sentences_per_segment=2)
    cues = parsed(tmp_path, [tr], Options(), "vtt")
    check_limits(cues, 42, 2, 6.0)
    assert " ".join(t.replace("\n", " ") for _, _, t in cues).split() == LOREM.split()
    assert cues[0][0] == tr.segments[0].start and cues[-1][1] <= tr.segments[-1].end + 1e-3


def test_width_zero_keeps_one_cue_per_segment(tmp_path):
    tr = synthetic()
    cues = parsed(tmp_path, [tr], make_options(Options, {"max_line_width": 0}), "srt")
    assert [t for _, _, t in cues] == [s.text for s in tr.segments]


def test_files_of_a_batch_never_share_a_cue(tmp_path):
    a, b = synthetic("One two three."), synthetic("Four five six.")
    cues = parsed(tmp_path, [a, b], Options(), "srt")
    assert [t for _, _, t in cues] == ["One two three.", "Four five six."]
    assert cues[1][0] >= a.audio_s


def test_a_word_longer_than_a_line_is_cut_to_fit(tmp_path):
    tr = synthetic("See https://example.org/a/very/long/path/that/never/ends/in/a/subtitle/line today.")
    check_limits(parsed(tmp_path, [tr], Options(), "srt"), 42, 2, 6.0)


def test_highlight_words_underlines_each_word_in_turn(tmp_path):
    tr = synthetic("The quick brown fox jumps over the lazy dog.")
    opts = make_options(Options, {"highlight_words": True})
    assert opts.word_timestamps  # underlining needs word times
    cues = parsed(tmp_path, [tr], opts, "vtt")
    marked = [re.search(r"<u>(.+?)</u>", t).group(1) for _, _, t in cues if "<u>" in t]
    assert marked == "The quick brown fox jumps over the lazy dog.".split()
    check_limits(cues, 42, 2, 6.0)
    words = tr.segments[0].words
    spoken = [(a, b) for a, b, t in cues if "<u>" in t]
    assert spoken == [(w.start, w.end) for w in words]


def test_subtitle_options_are_validated_and_srt_vtt_ask_for_word_times():
    for bad in ({"max_line_width": 5}, {"max_line_count": 0}, {"max_cue_s": 0.5}):
        with pytest.raises(TaskError):
            make_options(Options, bad)
    o = Options()
    assert TASK.options_for_format(o, "srt").word_timestamps
    assert TASK.options_for_format(o, "vtt").word_timestamps
    assert not TASK.options_for_format(o, "txt").word_timestamps
    assert not TASK.options_for_format(make_options(Options, {"max_line_width": 0}), "srt").word_timestamps
    from taskrun.runner.inputs import options_from  # what a front door builds a job's options with

    assert options_from(TASK, {}, "vtt").word_timestamps and not options_from(TASK, {}).word_timestamps


def test_transformers_runtime_gives_word_timestamps(tiny_dir):
    r = CliRunner().invoke(
        main,
        [
            "transcribe",
            str(clip(tiny_dir)),
            "--model",
            str(build(tiny_dir)),
            "--runtime",
            "transformers",
            "--word-timestamps",
            "--json",
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["items"][0]["result"]
    for seg in res["segments"]:
        assert seg["words"] is not None
        for w in seg["words"]:
            assert seg["start"] <= w["start"] <= w["end"] <= seg["end"]


def test_token_times_group_into_words():
    from taskrun.pipelines.speech.hf_engine import whisper_segments

    begin, eot = 50363, 50256
    vocab = {1: " Hello", 2: ",", 3: " wor", 4: "ld", 5: " again"}
    ids = [begin, 1, 2, 3, 4, begin + 100, begin + 100, 5, begin + 150]
    times = [0.0, 0.5, 0.6, 0.9, 1.2, 2.0, 2.0, 2.6, 3.0]
    pieces = whisper_segments(ids, begin, eot, lambda t: "".join(vocab[i] for i in t), times)
    assert [w[2] for w in pieces[0].words] == ["Hello,", "world"]
    assert pieces[0].words[0][:2] == (0.0, 0.6) and pieces[0].words[1][:2] == (0.6, 1.2)
    assert [w[:3] for w in pieces[1].words] == [(2.0, 2.6, "again")]


@pytest.mark.real
def test_real_srt_end_to_end_keeps_the_limits(tmp_path):
    import soundfile as sf

    x, sr = sf.read(SAMPLES / "meeting.wav", dtype="int16")
    path = tmp_path / "m.wav"
    sf.write(path, x[: 33 * sr], sr, subtype="PCM_16")  # the five LibriVox sentences
    out = tmp_path / "m.srt"
    r = CliRunner().invoke(main, ["transcribe", str(path), "--word-timestamps", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    subs = pysrt.open(str(out))
    cues = [(s.start.ordinal / 1000, s.end.ordinal / 1000, s.text) for s in subs]
    check_limits(cues, 42, 2, 6.0)
    assert len(cues) >= 6 and "Dashwood" in " ".join(t for _, _, t in cues)


def test_words_written_without_a_space_stay_one_word(tmp_path):
    words = (
        Word(0.0, 0.4, "He", 0.9),
        Word(0.4, 0.8, "was", 0.9),
        Word(0.8, 1.0, "ill", 0.9),
        Word(1.0, 1.6, "-disposed.", 0.9),
    )
    tr = Transcript("x.wav", "He was ill-disposed.", "en", 2.0, [Segment(0.0, 1.6, "He was ill-disposed.", words)])
    cues = parsed(tmp_path, [tr], Options(), "srt")
    assert [t for _, _, t in cues] == ["He was ill-disposed."]
