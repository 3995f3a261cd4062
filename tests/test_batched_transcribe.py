"""Batched decoding (--batch-size) on the ctranslate2 runtime (pipelines/speech/ct2_batch.py) and on
transformers (HFSpeechEngine.decode_batch): the windows of a long file after its first are decoded
as batches, the first of each prompted with the text before it, with word timestamps; the real
tiny.en gives the same words as the sequential decoder on both (marked real)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from taskrun.pipelines.speech import ct2_batch
from taskrun.pipelines.speech.ct2_engine import CT2WhisperEngine
from taskrun.pipelines.speech.engine import PROMPT_CHARS, FileState, Piece, SpeechEngine
from taskrun.pipelines.speech.hf_engine import HFSpeechEngine
from taskrun.runner.jobs import run_job
from taskrun.tasks.base import TaskError
from taskrun.tasks.inputs import file_input
from taskrun.tasks.transcribe import TASK, Options
from tests.tiny.whisper import SAMPLES, build, build_ct2
from tools.wer import wer

SR = 16000
TS = 1000  # the timestamp token <|0.00|> in these unit tests
EOT = 900


def test_split_keeps_text_after_the_last_timestamp():
    # <|0.00|> a b <|1.00|><|1.00|> c <|2.00|> d e  (d e: no closing timestamp)
    tokens = [TS, 1, 2, TS + 50, TS + 50, 3, TS + 100, 4, 5, EOT]
    segs = ct2_batch.split_tokens(tokens, TS, EOT, duration=7.5)
    assert [(s["start"], s["end"], s["tokens"]) for s in segs] == [
        (0.0, 1.0, [1, 2]),
        (1.0, 2.0, [3]),
        (2.0, 7.5, [4, 5]),
    ]


def test_quality_rules_match_whispers():
    v = ct2_batch.BatchDecoder.verdict
    assert v({"no_speech_prob": 0.9, "avg_logprob": -1.5, "compression_ratio": 1.0}) == "skip"
    assert v({"no_speech_prob": 0.9, "avg_logprob": -0.2, "compression_ratio": 1.0}) == "ok"
    assert v({"no_speech_prob": 0.1, "avg_logprob": -0.2, "compression_ratio": 3.0}) == "retry"
    assert v({"no_speech_prob": 0.1, "avg_logprob": -1.2, "compression_ratio": 1.0}) == "retry"


def long_file(tmp_path, copies: int = 2):
    x, _ = sf.read(SAMPLES / "meeting.wav", dtype="float32")
    path = tmp_path / "long.wav"
    sf.write(path, np.concatenate([x] * copies), SR, subtype="PCM_16")
    return path


def spy_batches(monkeypatch, engine=CT2WhisperEngine):
    """Record each decode_batch call's window count and the prompt it was given."""
    calls = []
    real = engine.decode_batch

    def spy(self, windows, options, state):
        calls.append((len(windows), state.previous))
        return real(self, windows, options, state)

    monkeypatch.setattr(engine, "decode_batch", spy)
    return calls


def spy_generate(monkeypatch):
    """The batch size of each transformers Whisper generate call."""
    from transformers import WhisperForConditionalGeneration

    sizes = []
    real = WhisperForConditionalGeneration.generate

    def spy(self, input_features=None, *args, **kwargs):
        sizes.append(len(input_features))
        return real(self, input_features, *args, **kwargs)

    monkeypatch.setattr(WhisperForConditionalGeneration, "generate", spy)
    return sizes


def transcribe(path, model, runtime=None, **options):
    rec = run_job(TASK, lambda: [file_input(path)], Options(**options), model=model, runtime=runtime, log=None)
    return rec.results[0]


def test_long_file_after_its_first_window_is_decoded_as_one_batch(tiny_dir, tmp_path, monkeypatch):
    calls = spy_batches(monkeypatch)
    res = transcribe(
        long_file(tmp_path),
        str(build_ct2(tiny_dir)),
        beam_size=1,
        vad=False,
        chunk_s=20.0,
        word_timestamps=True,
        batch_size=8,
    )
    assert calls and calls[0][0] > 1  # one batch of the windows after the first
    assert calls[0][1].strip()  # prompted with the first window's text
    starts = [s.start for s in res.segments]
    assert starts == sorted(starts) and res.segments[-1].start > 61  # the second copy keeps its offset
    for s in res.segments:
        for w in s.words or ():
            assert isinstance(w.start, float) and s.start <= w.start <= w.end <= s.end + 1e-6


def test_the_default_decodes_window_by_window(tiny_dir, tmp_path, monkeypatch):
    calls = spy_batches(monkeypatch)
    transcribe(long_file(tmp_path), str(build_ct2(tiny_dir)), beam_size=1, vad=False, chunk_s=20.0)
    assert calls == []


def test_an_engine_that_cannot_batch_decodes_window_by_window(tiny_dir, tmp_path, monkeypatch):
    calls = spy_batches(monkeypatch)
    monkeypatch.setattr(CT2WhisperEngine, "batch_windows", 1)
    transcribe(long_file(tmp_path), str(build_ct2(tiny_dir)), beam_size=1, vad=False, chunk_s=20.0, batch_size=8)
    assert calls == []


def test_transformers_decodes_the_windows_after_the_first_in_one_generate_call(tiny_dir, tmp_path, monkeypatch):
    calls = spy_batches(monkeypatch, HFSpeechEngine)
    sizes = spy_generate(monkeypatch)
    res = transcribe(
        long_file(tmp_path),
        str(build(tiny_dir)),
        "transformers",
        beam_size=1,
        vad=False,
        chunk_s=20.0,
        word_timestamps=True,
        batch_size=8,
    )
    assert calls and calls[0][0] > 1 and calls[0][1].strip()  # a batch, prompted with the text before it
    # the file's first window alone, the batch's first alone (prompted), the rest together; a
    # window's leftover speech may add single-window calls, never another batch
    assert sizes[:3] == [1, 1, calls[0][0] - 1] and max(sizes[3:], default=1) == 1
    starts = [s.start for s in res.segments]
    assert starts == sorted(starts) and res.segments[-1].start > 61
    for s in res.segments:
        for w in s.words or ():
            assert s.start <= w.start <= w.end <= s.end + 1e-6


class EarlyStopper(SpeechEngine):
    """Times at most 5 s of whatever it hears, then stops: Whisper's early stop, every time."""

    runtime = "stub"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def decode(self, samples, options, state):
        self.prompts.append(state.previous)
        return [Piece(0.0, min(5.0, len(samples) / SR), "words " * 40)]


def test_speech_after_the_last_timestamp_is_decoded_on_until_none_is_left():
    stub = EarlyStopper()
    tail = stub._tail(np.zeros(22 * SR, np.float32), [Piece(0.0, 5.0, "first")], None, FileState("en", "p" * 390))
    assert [(p.start, p.end) for p in tail] == [(5.0, 10.0), (10.0, 15.0), (15.0, 20.0), (20.0, 22.0)]
    assert stub.prompts[0].endswith("first") and all(len(p) <= PROMPT_CHARS for p in stub.prompts)
    # nothing timed (silence by the no-speech rule), or a piece that runs to the end: no pass
    assert stub._tail(np.zeros(22 * SR, np.float32), [], None, FileState("en")) == []
    assert stub._tail(np.zeros(22 * SR, np.float32), [Piece(0.0, None, "all")], None, FileState("en")) == []
    assert len(stub.prompts) == 4


def test_batch_size_is_validated():
    with pytest.raises(TaskError, match="--batch-size must be 1 to 64"):
        Options(batch_size=0)


@pytest.mark.real
@pytest.mark.parametrize("beam", [1, 5])
def test_real_batched_words_match_sequential_on_the_meeting(beam, monkeypatch):
    """Short windows (10 s) so that the 61 s meeting makes a batch; the words of the batched
    decode are those of the sequential one within 1 WER point, every word has its time, and
    the batch's first window is prompted with the text before it."""
    meeting = SAMPLES / "meeting.wav"
    reference = (SAMPLES / "meeting.txt").read_text()
    calls = spy_batches(monkeypatch)
    opts = dict(beam_size=beam, chunk_s=10.0, word_timestamps=True)
    batched = transcribe(meeting, "whisper-tiny.en", batch_size=8, **opts)
    assert calls and calls[0][0] > 1 and calls[0][1].strip()
    sequential = transcribe(meeting, "whisper-tiny.en", **opts)
    assert len(calls) == 1
    # within one word of the sequential decoder against the reference transcript (1.04 WER points
    # on these 96 words): the sequential one now seeks through the file's speech with its own
    # context, so beam 5 there makes 9 errors at 10 s windows and batched beam 5 makes 10
    assert wer(reference, batched.text) <= wer(reference, sequential.text) + 1 / 94 + 1e-9
    words = " ".join(w.word for s in batched.segments for w in s.words)
    assert wer(batched.text, words) == 0  # every word has its time
    times = [(w.start, w.end) for s in batched.segments for w in s.words]
    assert all(a <= b for a, b in times) and times == sorted(times)


@pytest.mark.real
def test_real_transformers_batched_words_match_sequential_on_the_meeting(monkeypatch):
    """The same on the transformers runtime: the batched words are the sequential ones within 1
    WER point, every word is timed, and neither repeats the prompt it was given (the transcript
    stays within 7 % WER of the reference; 5.2 % measured)."""
    meeting = SAMPLES / "meeting.wav"
    reference = (SAMPLES / "meeting.txt").read_text()
    calls = spy_batches(monkeypatch, HFSpeechEngine)
    opts = dict(chunk_s=10.0, word_timestamps=True, language="en")
    batched = transcribe(meeting, "whisper-tiny.en", "transformers", batch_size=8, **opts)
    assert calls and calls[0][0] > 1 and calls[0][1].strip()
    sequential = transcribe(meeting, "whisper-tiny.en", "transformers", **opts)
    assert wer(reference, sequential.text) <= 0.07
    assert wer(reference, batched.text) <= wer(reference, sequential.text) + 1 / 94 + 1e-9
    words = " ".join(w.word for s in batched.segments for w in s.words)
    assert wer(batched.text, words) == 0
    times = [(w.start, w.end) for s in batched.segments for w in s.words]
    assert all(a <= b for a, b in times) and times == sorted(times)
