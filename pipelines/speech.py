"""The part of transcription that does not depend on the runtime: read each file in bounded
memory, cut it into chunks, skip silence, hand each chunk to the runtime's decoder, place the
segments on the file's timeline, stream them, and measure.

A runtime subclasses :class:`SpeechPipeline` and implements ``decode(samples, options, state)``,
yielding :class:`Piece` objects whose times are relative to the samples it was given.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from pipelines import audio
from pipelines.base import Pipeline
from tasks import events as ev
from tasks.base import TaskError
from tasks.transcribe import Metrics, Segment, Transcript, Word

SEAM_S = 8.0  # a chunk's cut is chosen in its last SEAM_S seconds, where a pause is likely


@dataclass
class Piece:
    """A decoded segment, times relative to the decoded samples; ``end`` None = runs to their end."""

    start: float
    end: float | None
    text: str
    words: list[tuple[float, float, str, float]] | None = None


@dataclass
class FileState:
    """What a decoder may carry from one chunk of a file to the next (the detected language)."""

    language: str | None


class _Stopwatch:
    """Processing time of a generator, excluding the time its consumer holds it at a yield."""

    def __init__(self) -> None:
        self.total = 0.0
        self.t = time.perf_counter()

    def pause(self) -> None:
        self.total += time.perf_counter() - self.t

    def resume(self) -> None:
        self.t = time.perf_counter()


def place(pieces: list[Piece] | Iterator[Piece], offset_s: float, end_s: float, floor_s: float) -> Iterator[Segment]:
    """Pieces from a chunk starting at ``offset_s`` → file-time segments, kept inside
    [floor_s, end_s] and in order: Whisper's timestamps can run past the audio it was given."""
    t, last_raw = floor_s, 0.0
    for p in pieces:
        text = p.text.strip()
        if not any(c.isalnum() for c in text):  # "." or "♪" alone: nothing was said
            continue
        if p.start + 1.0 < last_raw:  # a start that jumps back: the decoder restarted and is inventing
            continue
        last_raw = p.start
        start = min(max(offset_s + p.start, t), end_s)
        stop = end_s if p.end is None else min(max(offset_s + p.end, start), end_s)
        words = None
        if p.words is not None:
            words, wt = [], start
            for ws, we, w, prob in p.words:
                a = min(max(offset_s + ws, wt), stop)
                b = min(max(offset_s + we, a), stop)
                words.append(Word(round(a, 3), round(b, 3), w, round(float(prob), 4)))
                wt = a
            words = tuple(words)
        t = stop
        yield Segment(round(start, 3), round(stop, 3), text, words)


def join_text(segments: list[Segment]) -> str:
    return " ".join(s.text for s in segments).strip()


class SpeechPipeline(Pipeline):
    task = "transcribe"
    sample_rate = 16000

    def decode(self, samples: np.ndarray, options: Any, state: FileState) -> Iterator[Piece]:
        raise NotImplementedError

    def default_language(self) -> str:
        return "en"

    def check_options(self, options: Any) -> None:
        """Refuse options this model cannot honour (before any audio is read)."""

    def run(self, inputs, options, clock):
        self.check_options(options)
        sw = _Stopwatch()
        totals = {"audio": 0.0, "speech": 0.0, "chunks": 0, "words": 0}
        infos: dict[int, audio.AudioInfo] = {}
        for i, inp in enumerate(inputs):  # probe all first: bad files fail fast, the bar knows the total
            try:
                infos[i] = self._probe(inp)
            except TaskError as exc:
                sw.pause()
                yield self._failed(inputs, i, exc)
                sw.resume()
        total_s = sum(info.duration_s for info in infos.values())
        done_s = 0.0
        for i, info in infos.items():
            inp = inputs[i]
            segments: list[Segment] = []
            state = FileState(options.language)
            file_s = 0.0
            try:
                for chunk in audio.chunked(audio.read_blocks(info.path, self.sample_rate), self.sample_rate,
                                           options.chunk_s, min(SEAM_S, options.chunk_s / 3)):
                    file_s = chunk.end_s
                    for seg in self._decode_chunk(chunk, options, state, totals, segments):
                        segments.append(seg)
                        sw.pause()
                        yield ev.Partial(seg, i)
                        sw.resume()
                    sw.pause()
                    yield ev.Progress(round(min(done_s + chunk.end_s, total_s), 2), round(total_s, 2), "s",
                                      "audio")
                    sw.resume()
            except TaskError as exc:
                sw.pause()
                yield self._failed(inputs, i, exc)
                sw.resume()
                continue
            done_s += info.duration_s
            totals["audio"] += file_s
            result = Transcript(source=inp.source, text=join_text(segments),
                                language=state.language or self.default_language(),
                                audio_s=round(file_s, 3), segments=segments)
            totals["words"] += len(result.text.split())
            sw.pause()
            yield ev.Item(i, inp.source, result)
            sw.resume()
        sw.pause()
        proc = sw.total
        a = totals["audio"]
        speech = totals["speech"] if options.vad else None
        yield ev.Done(Metrics(audio_s=round(a, 3), rtf=proc / a if a else 0.0, chunks=totals["chunks"],
                              words=totals["words"], speech_s=None if speech is None else round(speech, 3),
                              rtf_speech=(proc / speech if speech else None) if options.vad else None))

    @staticmethod
    def _failed(inputs, i: int, exc: TaskError) -> ev.ItemError:
        """One bad file: the job's error when it is the only one, else an ItemError and the rest go on."""
        if len(inputs) == 1:
            raise exc
        msg, path = str(exc), inputs[i].path or ""
        if path and msg.startswith(path):  # the printer already names the file
            msg = msg[len(path):].lstrip(" :")
        return ev.ItemError(i, inputs[i].source, msg)

    def _probe(self, inp) -> audio.AudioInfo:
        if not inp.path:
            raise TaskError(f"{inp.source}: transcribe takes audio files, not text")
        info = audio.probe(inp.path)
        if info.frames == 0:
            raise TaskError(f"{inp.path} holds no audio samples (0 s); give a recording with sound in it")
        return info

    def _decode_chunk(self, chunk: audio.Chunk, options, state: FileState, totals: dict,
                      done: list[Segment]) -> Iterator[Segment]:
        x, sr = chunk.samples, chunk.sr
        lo, hi = 0, len(x)
        if audio.is_silent(x):  # digital silence or near it: nothing to hear, even without VAD
            return
        if options.vad and sr == 16000:  # Silero runs at 16 kHz; other rates keep the level gate only
            spans = audio.speech_spans(x, sr)
            if not spans:
                return
            totals["speech"] += sum(b - a for a, b in spans) / sr
            # Skip the silence before the first speech; keep the rest to the cut, which is already in
            # a pause: audio that stops right after the last word invites Whisper to invent more.
            lo = spans[0][0]
        totals["chunks"] += 1
        floor = done[-1].end if done else 0.0
        pieces = self.decode(x[lo:hi], options, state)
        yield from place(pieces, chunk.start_s + lo / sr, chunk.start_s + hi / sr, max(floor, chunk.start_s))
