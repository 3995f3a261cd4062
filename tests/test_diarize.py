"""--speakers without a model: clustering on synthetic voice embeddings, labels laid on words,
and the txt/srt/vtt/rttm writers (the real GE2E run is tests/test_diarize_real.py)."""

from __future__ import annotations

import numpy as np
import pytest

from taskrun.pipelines.speech.diarize import cluster, label, split_span
from taskrun.tasks.base import TaskError
from taskrun.tasks.speakers import to_rttm
from taskrun.tasks.transcribe import Options, Segment, Transcript, Word, to_srt, to_txt, to_vtt
from tools.der import der, read_rttm


def voices(counts, spread=0.25, seed=0):
    """Unit vectors around one random centre per voice, in the order given."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(counts), 64))
    rows = [
        centres[k] + spread * rng.normal(size=64) * np.linalg.norm(centres[k]) / 8
        for k, c in enumerate(counts)
        for _ in range(c)
    ]
    e = np.array(rows, np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def test_cluster_finds_the_voices_and_numbers_them_by_first_speech():
    e = voices([4, 3, 5])
    order = [5, 0, 8, 1, 2, 9, 3, 4, 6, 10, 7, 11]  # interleaved turns
    ids = cluster(e[order])
    assert len(set(ids)) == 3 and ids[0] == 0
    truth = [0 if i < 4 else 1 if i < 7 else 2 for i in order]
    assert len({(a, b) for a, b in zip(ids, truth)}) == 3  # one-to-one with the truth


def test_cluster_honours_the_speaker_count_bounds():
    e = voices([4, 4, 4])
    assert len(set(cluster(e, num=2))) == 2
    assert len(set(cluster(e, hi=2))) == 2
    assert len(set(cluster(e, lo=5))) == 5
    assert len(set(cluster(voices([6])))) == 1
    assert len(cluster(np.zeros((0, 64), np.float32))) == 0


def test_cluster_is_stable_across_reruns():
    e = voices([3, 3], seed=4)
    assert list(cluster(e)) == list(cluster(e.copy()))


def test_long_spans_split_into_windows_of_at_most_three_seconds():
    wins = split_span(0, 16000 * 7, 16000)
    assert len(wins) == 3 and wins[0][0] == 0 and wins[-1][1] == 16000 * 7
    assert all(1.5 * 16000 <= b - a <= 3 * 16000 for a, b in wins)


def words(*spec):
    return tuple(Word(a, b, w, None) for a, b, w in spec)


def test_a_change_of_voice_inside_a_segment_splits_it_at_the_word():
    seg = Segment(
        0.0, 4.0, "yes I agree no", words((0, 0.5, " yes"), (0.5, 1, " I"), (1, 1.5, " agree"), (2.5, 4, " no"))
    )
    turns = [(0.0, 1.6, "SPEAKER_1"), (2.2, 4.0, "SPEAKER_2")]
    out = label([seg], turns)
    assert [(s.start, s.end, s.text, s.speaker) for s in out] == [
        (0.0, 1.5, "yes I agree", "SPEAKER_1"),
        (2.5, 4.0, "no", "SPEAKER_2"),
    ]
    assert all(w.speaker == s.speaker for s in out for w in s.words)


def labelled():
    segs = [
        Segment(0.5, 2.0, "Hello there.", words((0.5, 1.0, " Hello"), (1.0, 2.0, " there.")), "SPEAKER_1"),
        Segment(2.5, 4.0, "Hi.", words((2.5, 4.0, " Hi.")), "SPEAKER_2"),
        Segment(4.2, 5.0, "Bye.", words((4.2, 5.0, " Bye.")), "SPEAKER_2"),
    ]
    return Transcript("talk.wav", "Hello there. Hi. Bye.", "en", 6.0, segs)


def test_text_formats_name_the_speaker():
    tr = labelled()
    assert to_txt([tr]).splitlines()[0] == "[00:00.5 → 00:02.0] SPEAKER_1: Hello there."
    vtt = to_vtt([tr], Options())
    assert "<v SPEAKER_1>Hello there." in vtt and "<v SPEAKER_2>Bye." in vtt
    srt = to_srt([tr], Options())
    assert "SPEAKER_1: Hello there." in srt and "SPEAKER_2: Hi." in srt


def test_rttm_parses_back_to_the_segments_turns():
    tr = labelled()
    turns = read_rttm(to_rttm(tr.source, tr.segments))
    assert turns == [(0.5, 2.0, "SPEAKER_1"), (2.5, 5.0, "SPEAKER_2")]
    assert der([(s.start, s.end, s.speaker) for s in tr.segments], turns) == 0.0  # joined within the collar


def test_rttm_without_speakers_names_the_fix():
    with pytest.raises(TaskError, match="--speakers"):
        to_rttm("a.wav", [Segment(0, 1, "x")])


def test_speaker_counts_need_speakers():
    with pytest.raises(TaskError, match="need --speakers"):
        Options(num_speakers=2)
    assert Options(speakers=True).word_timestamps


def test_der_counts_confusion_and_miss():
    ref = [(0.0, 10.0, "a"), (10.0, 20.0, "b")]
    assert der(ref, [(0.0, 10.0, "x"), (10.0, 20.0, "y")]) == 0.0
    assert 0.45 < der(ref, [(0.0, 20.0, "x")]) < 0.55


def test_meeting_notes_hands_summarize_who_said_what():
    """The chain asks transcribe for speakers, the handoff keeps the labels, and the summary
    prompt then asks for decisions and actions by speaker (plain text leaves the prompt alone)."""
    from taskrun.pipelines.llm.summarize import BY_SPEAKER, by_speaker
    from taskrun.runner.chains.run import load_chain
    from taskrun.tasks.transcribe import TASK

    assert load_chain("meeting-notes").steps[0].options.get("speakers") is True
    text = TASK.handoff(labelled())
    assert text == "SPEAKER_1: Hello there.\nSPEAKER_2: Hi.\nSPEAKER_2: Bye."
    template = "Summarize {how}.\n\n{text}"
    assert by_speaker(template, text) == "Summarize {how}." + BY_SPEAKER + "\n\n{text}"
    assert by_speaker(template, labelled().text) == template
