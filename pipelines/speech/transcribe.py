"""The part of transcription that does not depend on the runtime: read each file in bounded
memory, cut it into chunks, skip silence, hand each chunk to the runtime's decoder, place the
segments on the file's timeline, stream them, and measure.

A runtime subclasses :class:`SpeechPipeline` and implements ``decode(samples, options, state)``,
yielding :class:`Piece` objects whose times are relative to the samples it was given.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from taskrun.pipelines.speech import audio
from taskrun.pipelines.base import Pipeline
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.transcribe import Metrics, Segment, Transcript, Word

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
    previous: str = ""  # the text decoded so far (its tail prompts the next window, as Whisper does)


class _Stopwatch:
    """Processing time of a generator, excluding the time its consumer holds it at a yield."""

    def __init__(self) -> None:
        self.total = 0.0
        self.t = time.perf_counter()

    def pause(self) -> None:
        self.total += time.perf_counter() - self.t

    def resume(self) -> None:
        self.t = time.perf_counter()


def place(pieces: list[Piece] | Iterator[Piece], offset_s: float, end_s: float, floor_s: float,
          timeline=None) -> Iterator[Segment]:
    """Pieces from a chunk starting at ``offset_s`` (or mapped by ``timeline(t, is_end)`` when the
    decoded audio was packed from several places) → file-time segments, kept inside
    [floor_s, end_s] and in order: Whisper's timestamps can run past the audio it was given."""
    at = timeline or (lambda t, is_end=False: offset_s + t)
    t, last_raw = floor_s, 0.0
    for p in pieces:
        text = p.text.strip()
        if not any(c.isalnum() for c in text):  # "." or "♪" alone: nothing was said
            continue
        if p.start + 1.0 < last_raw:  # a start that jumps back: the decoder restarted and is inventing
            continue
        last_raw = p.start
        start = min(max(at(p.start), t), end_s)
        stop = end_s if p.end is None else min(max(at(p.end, True), start), end_s)
        words = None
        if p.words is not None:
            words, wt = [], start
            for ws, we, w, prob in p.words:
                a = min(max(at(ws), wt), stop)
                b = min(max(at(we, True), a), stop)
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

    multilingual = False  # a runtime says whether its loaded model knows several languages

    def languages(self) -> list[str]:
        """Language codes the model knows (multilingual models)."""
        return []

    def check_options(self, options: Any) -> None:
        """Refuse options this model cannot honour (before any audio is read)."""
        if not self.multilingual:
            if options.language not in (None, "en"):
                raise TaskError(f"`{self.card.name}` is English-only; for --language {options.language} "
                                f"use a multilingual model such as whisper-base")
            if options.task == "translate":
                raise TaskError(f"`{self.card.name}` is English-only and cannot translate; use a "
                                f"multilingual model such as whisper-base with --task translate")
        elif options.language and options.language not in self.languages():
            raise TaskError(f"`{self.card.name}` does not know language '{options.language}'; it knows "
                            f"{', '.join(self.languages()[:12])}, ...")

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
                chunks = audio.chunked(audio.read_blocks(info.path, self.sample_rate), self.sample_rate,
                                       options.chunk_s, min(SEAM_S, options.chunk_s / 3))
                for item in self._windows(chunks, options, totals):
                    if isinstance(item, audio.Chunk):  # read so far: progress over the file
                        file_s = item.end_s
                        sw.pause()
                        yield ev.Progress(round(min(done_s + file_s, total_s), 2), round(total_s, 2), "s", "audio")
                        sw.resume()
                        continue
                    totals["chunks"] += 1
                    floor = segments[-1].end if segments else 0.0
                    for seg in place(self.decode(item.samples, options, state), 0.0, item.end_s, floor,
                                     timeline=item.to_file):
                        segments.append(seg)
                        state.previous = (state.previous + " " + seg.text)[-400:]
                        sw.pause()
                        yield ev.Partial(seg, i)
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

    def _windows(self, chunks: Iterator[audio.Chunk], options, totals: dict) -> Iterator[Any]:
        """What the model decodes: with VAD, the speech of consecutive chunks packed into windows
        of at most chunk_s (as faster-whisper's vad_filter does, so pauses cost nothing); without,
        each chunk that is not silent. Each chunk is also passed through, after its speech, to
        report progress. Memory: one chunk plus one window."""
        sr = self.sample_rate
        limit = int(options.chunk_s * sr)
        use_vad = options.vad and sr == 16000  # Silero runs at 16 kHz; other rates keep the level gate
        pack = Window(sr)
        for chunk in chunks:
            x = chunk.samples
            if not audio.is_silent(x):  # digital silence or near it: nothing to hear, even without VAD
                spans = audio.speech_spans(x, sr) if use_vad else [(0, len(x))]
                if use_vad:
                    totals["speech"] += sum(b - a for a, b in spans) / sr
                for a, b in spans:
                    if pack.length and pack.length + (b - a) > limit:
                        yield pack
                        pack = Window(sr)
                    pack.add(x[a:b].copy(), chunk.start + a)  # a copy: a view would keep the whole chunk
                if not use_vad and pack.length:  # without VAD a chunk is a window: no packing
                    yield pack
                    pack = Window(sr)
            yield chunk
        if pack.length:
            yield pack


class Window:
    """Pieces of a file's audio laid end to end for one decode, and the map back to file time."""

    def __init__(self, sr: int) -> None:
        self.sr = sr
        self.parts: list[tuple[int, int, np.ndarray]] = []  # (start in window, start in file, samples)
        self.length = 0

    def add(self, samples: np.ndarray, file_start: int) -> None:
        self.parts.append((self.length, file_start, samples))
        self.length += len(samples)

    @property
    def samples(self) -> np.ndarray:
        return np.concatenate([p[2] for p in self.parts]) if len(self.parts) > 1 else self.parts[0][2]

    @property
    def end_s(self) -> float:
        w, f, x = self.parts[-1]
        return (f + len(x)) / self.sr

    def to_file(self, t: float, is_end: bool = False) -> float:
        """Window seconds → file seconds. A time on a seam between two parts is the end of the
        first when it ends a segment, the start of the second when it starts one."""
        pos = t * self.sr
        starts = [w for w, _, _ in self.parts]
        k = max(0, (bisect_left(starts, pos) if is_end else bisect_right(starts, pos)) - 1)
        w, f, x = self.parts[k]
        return (f + min(max(pos - w, 0), len(x))) / self.sr
