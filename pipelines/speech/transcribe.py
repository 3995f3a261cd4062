"""transcribe, written once for every runtime: read each file in bounded memory, cut it into
chunks, skip silence, hand each window to the runtime's engine (pipelines/speech/engine.py), place
the segments on the file's timeline, stream them, and measure.

The engine decodes one window and knows its model; this module knows files, time and the task's
options, so both runtimes see the same chunks and report the same metrics.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from taskrun.pipelines.base import EnginePipeline
from taskrun.pipelines.speech import audio
from taskrun.pipelines.speech.engine import PROMPT_CHARS, FileState, Piece, SpeechEngine
from taskrun.tasks import events as ev
from taskrun.tasks.audio_files import probe_input
from taskrun.tasks.base import Input, TaskError
from taskrun.tasks.clock import Clock, timed
from taskrun.tasks.transcribe import Metrics, Segment, Transcript, Word

SEAM_S = 8.0  # a chunk's cut is chosen in its last SEAM_S seconds, where a pause is likely
# A pause at least this long ends the packed window (or stretch) before it: the decoder never sees
# speech from both sides of it as one, so no segment is timed across it. Packed across a 4-minute
# pause, tiny.en timed one sentence 58.7 -> 309.5 s (a subtitle on screen through the silence).
GAP_S = 10.0


def place(
    pieces: list[Piece] | Iterator[Piece], offset_s: float, end_s: float, floor_s: float, timeline=None
) -> Iterator[Segment]:
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
                words.append(Word(round(a, 3), round(b, 3), w, None if prob is None else round(float(prob), 4)))
                wt = a
            words = tuple(words)
        t = stop
        yield Segment(round(start, 3), round(stop, 3), text, words)


def join_text(segments: list[Segment]) -> str:
    return " ".join(s.text for s in segments).strip()


@dataclass
class _Tally:
    """A job's running totals: what its progress bar and metrics are made of."""

    total_s: float = 0.0  # the headers' length of every readable file: the progress bar's end
    done_s: float = 0.0  # the headers' length of the files finished
    audio_s: float = 0.0  # audio actually read (a truncated file holds less than its header says)
    speech_s: float = 0.0  # what VAD kept
    chunks: int = 0  # pieces handed to the engine (a seeking engine's are long stretches)
    words: int = 0
    speakers: int = 0  # voices found, summed over files (with --speakers)
    diarize_s: float = 0.0
    speaker_model: str | None = None


def _item_error(i: int, inp: Input, exc: TaskError) -> ev.ItemError:
    """One bad file, reported as its item's error; the runner decides what it means for the job
    (the job's error when it is the only input, else the rest go on)."""
    msg, path = str(exc), inp.path or ""
    if path and msg.startswith(path):  # ItemError.describe() names the file once
        msg = msg[len(path) :].lstrip(" :")
    return ev.ItemError(i, inp.source, msg)


class TranscribePipeline(EnginePipeline):
    """transcribe on any :class:`SpeechEngine`: the engine class comes from the RUNTIMES row (the
    engine resolves its own device: CTranslate2's devices are not torch's)."""

    task = "transcribe"
    engine: SpeechEngine

    @staticmethod
    def advise_model(card, inputs: list[Input], options: Any, **kw) -> tuple[Any, list[str]]:
        """Before the model loads: an English-only default and speech that is not English (or a
        --language that is not en) → the multilingual default, or a warning for a model the user
        named (pipelines/speech/language.py)."""
        from taskrun.pipelines.speech.language import advise

        return advise(card, inputs, options, **kw)

    def check_options(self, options: Any) -> None:
        """Refuse options this model cannot honour, before any audio is read: the runtime's own
        refusals first, then the language checks every Whisper-like engine shares."""
        engine, name = self.engine, self.card.name
        engine.check_options(options)
        if not engine.takes_language:
            return
        if not engine.multilingual:
            if options.language not in (None, "en"):
                raise TaskError(
                    f"`{name}` is English-only; for --language {options.language} "
                    f"use a multilingual model such as whisper-base"
                )
            if options.task == "translate":
                raise TaskError(
                    f"`{name}` is English-only and cannot translate; use a "
                    f"multilingual model such as whisper-base with --task translate"
                )
        elif options.language and options.language not in engine.languages():
            raise TaskError(
                f"`{name}` does not know language '{options.language}'; it knows "
                f"{', '.join(engine.languages()[:12])}, ..."
            )

    def run(self, inputs: list[Input], options: Any, clock: Clock) -> Iterator[Any]:
        self.check_options(options)
        tally = _Tally()
        # rtf's processing time: read + resample + VAD + decode, not the consumer's time at a yield
        yield from timed(self._events(inputs, options, tally), lambda s: clock.add("transcribe", s))
        proc, a = clock.total("transcribe"), tally.audio_s
        speech = tally.speech_s if options.vad else None
        yield ev.Done(
            Metrics(
                audio_s=round(a, 3),
                rtf=proc / a if a else 0.0,
                chunks=tally.chunks,
                words=tally.words,
                speech_s=None if speech is None else round(speech, 3),
                rtf_speech=proc / speech if speech else None,
                speakers=tally.speakers if options.speakers else None,
                diarize_s=round(tally.diarize_s, 3) if options.speakers else None,
                speaker_model=tally.speaker_model,
            )
        )

    def _events(self, inputs: list[Input], options: Any, tally: _Tally) -> Iterator[Any]:
        infos: dict[int, audio.AudioInfo] = {}
        for i, inp in enumerate(inputs):  # probe all first: bad files fail fast, the bar knows the total
            try:
                infos[i] = probe_input(inp)
            except TaskError as exc:
                yield _item_error(i, inp, exc)
        tally.total_s = sum(info.duration_s for info in infos.values())
        for i, info in infos.items():
            yield from self._file(i, inputs[i], info, options, tally)

    def _file(self, i: int, inp: Input, info: audio.AudioInfo, options: Any, tally: _Tally) -> Iterator[Any]:
        """One file's events: progress as it is read, each segment as it is decoded, then its
        transcript, or its ItemError when it cannot be read to the end."""
        sr = self.engine.sample_rate
        segments: list[Segment] = []
        state = FileState(options.language)
        file_s = 0.0
        read = audio.ReadStats()  # what the file lacked (cut short) or held that was not audio (NaN)
        try:
            chunks = audio.chunked(
                audio.read_blocks(info, sr, stats=read), sr, options.chunk_s, min(SEAM_S, options.chunk_s / 3)
            )
            batch: list[Window] = []
            first = tally.chunks + 1  # the number of this file's first window in the job
            size = max(1, min(options.batch_size, self.engine.batch_windows))
            diarizer = self._diarizer(options, tally)
            for item in self._windows(chunks, options, tally, diarizer):
                if isinstance(item, audio.Chunk):  # read so far: progress over the file
                    file_s = item.end_s
                    yield ev.Progress(
                        round(min(tally.done_s + file_s, tally.total_s), 2), round(tally.total_s, 2), "s", "audio"
                    )
                    continue
                tally.chunks += 1
                batch.append(item)
                # the file's first window alone (it names the language, and its text prompts the
                # next batch's first window); then batch_windows at a time
                if len(batch) >= (size if tally.chunks > first else 1):
                    for seg in self._decode(batch, options, state, segments):
                        if diarizer is None:  # with --speakers a segment's voice is known at the file's end
                            yield ev.Partial(seg, i)
                    batch = []
            for seg in self._decode(batch, options, state, segments):  # the file's last windows
                if diarizer is None:
                    yield ev.Partial(seg, i)
        except TaskError as exc:
            yield _item_error(i, inp, exc)
            return
        for message, partial in read.notices(info.path, getattr(options, "allow_partial", False)):
            yield ev.Notice(message, partial=partial)
        tally.done_s += info.duration_s
        tally.audio_s += file_s
        if diarizer is not None:
            segments = self._label(segments, diarizer, options, tally)
        result = Transcript(
            source=inp.source,
            text=join_text(segments),
            language=state.language or self.engine.default_language,
            audio_s=round(file_s, 3),
            segments=segments,
        )
        tally.words += len(result.text.split())
        yield ev.Item(i, inp.source, result)

    def _decode(
        self, windows: list[Window], options: Any, state: FileState, segments: list[Segment]
    ) -> Iterator[Segment]:
        """Windows through the engine (one alone, or several with the engine's decode_batch), their
        pieces placed on the file's timeline after the segments so far (appended to
        ``segments``, and to the prompt for the window after them)."""
        if len(windows) > 1:
            decoded = self.engine.decode_batch([w.samples for w in windows], options, state)
        elif windows:
            decoded = [self.engine.decode(windows[0].samples, options, state)]
        else:
            decoded = []
        for window, pieces in zip(windows, decoded):
            floor = segments[-1].end if segments else 0.0
            for seg in place(pieces, 0.0, window.end_s, floor, timeline=window.to_file):
                segments.append(seg)
                state.previous = (state.previous + " " + seg.text)[-PROMPT_CHARS:]
                yield seg

    def _diarizer(self, options: Any, tally: _Tally):
        """A file's speaker windows collector with --speakers (the speaker model loaded once)."""
        if not getattr(options, "speakers", False):
            return None
        from taskrun.models.resolve import resolve
        from taskrun.pipelines.speech.diarize import SPEAKER_MODEL, Diarizer
        from taskrun.pipelines.speech.speakers import GE2EEngine

        card = resolve(SPEAKER_MODEL, offline=True)
        tally.speaker_model = f"{card.name}@{card.digest}"
        return Diarizer(GE2EEngine.load(card), self.engine.sample_rate)

    def _label(self, segments: list[Segment], diarizer, options: Any, tally: _Tally) -> list[Segment]:
        from taskrun.pipelines.speech.diarize import label

        turns = diarizer.turns(options.num_speakers, options.min_speakers, options.max_speakers)
        tally.speakers += len({t[2] for t in turns})
        tally.diarize_s += diarizer.seconds
        return label(segments, turns)

    def _windows(self, chunks: Iterator[audio.Chunk], options: Any, tally: _Tally, diarizer=None) -> Iterator[Any]:
        """What the model decodes: with VAD, the speech of consecutive chunks packed into windows
        of at most chunk_s (as faster-whisper's vad_filter does, so pauses cost nothing); without,
        each chunk that is not silent. Each chunk is also passed through, after its speech, to
        report progress. Memory: one chunk plus one window."""
        sr = self.engine.sample_rate
        # An engine that seeks through a long stretch itself gets many windows' worth at once (the
        # one-window batch decoder excepted): its decoder then cuts 30 s windows at its own last
        # timestamps and prompts each with the tokens before it, as faster-whisper does over a whole
        # file, instead of starting each window afresh at a cut chosen here.
        seeks = self.engine.seek_window_s if options.batch_size == 1 else None
        limit = int((seeks or options.chunk_s) * sr)
        use_vad = options.vad and sr == 16000  # Silero runs at 16 kHz; other rates keep the level gate
        pack = Window(sr)
        for chunk in chunks:
            x = chunk.samples
            if not audio.is_silent(x):  # digital silence or near it: nothing to hear, even without VAD
                spans = audio.speech_spans(x, sr) if use_vad else [(0, len(x))]
                if use_vad:
                    tally.speech_s += sum(b - a for a, b in spans) / sr
                if diarizer is not None:
                    diarizer.add(x, chunk.start, spans)
                for a, b in spans:
                    if pack.length and (pack.length + (b - a) > limit or chunk.start + a - pack.file_end > GAP_S * sr):
                        yield pack
                        pack = Window(sr)
                    pack.add(x[a:b].copy(), chunk.start + a)  # a copy: a view would keep the whole chunk
                if not use_vad and not seeks and pack.length:  # without VAD a chunk is a window
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
    def file_end(self) -> int:
        """The file sample just after the window's last part."""
        w, f, x = self.parts[-1]
        return f + len(x)

    @property
    def end_s(self) -> float:
        return self.file_end / self.sr

    def to_file(self, t: float, is_end: bool = False) -> float:
        """Window seconds → file seconds. A time on a seam between two parts is the end of the
        first when it ends a segment, the start of the second when it starts one."""
        pos = t * self.sr
        starts = [w for w, _, _ in self.parts]
        k = max(0, (bisect_left(starts, pos) if is_end else bisect_right(starts, pos)) - 1)
        w, f, x = self.parts[k]
        return (f + min(max(pos - w, 0), len(x))) / self.sr
