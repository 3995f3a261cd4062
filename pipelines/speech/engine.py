"""The speech engine: the one interface that transcribe drives, one window of audio at a time.

An engine turns at most 30 s of 16 kHz (or its ``sample_rate``) mono float32 samples into
:class:`Piece` objects timed relative to those samples, on one runtime. Everything above it
(reading and resampling files in bounded memory, chunking at pauses, VAD, placing pieces on the
file's timeline, the language checks, progress and metrics) is written once in
pipelines/speech/transcribe.py, so adding a runtime is one module with a subclass of
``SpeechEngine`` plus its row in ``taskrun.pipelines.RUNTIMES``:

    ("transcribe", "onnxruntime"): Runtime(_P + "speech.transcribe:TranscribePipeline",
                                           engine=_P + "speech.ort_engine:OrtWhisperEngine")

A subclass sets ``runtime`` as a class attribute and its facts in ``__init__``, and implements
``decode``; ``load`` caches the instance per (model, runtime, device, dtype).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.tasks.base import ModelCard

TAIL_S = 1.0  # speech left after a batched window's last timestamp that is decoded on its own
PROMPT_CHARS = 400  # how much of the text decoded so far is kept to prompt the next window


@dataclass
class Piece:
    """A decoded segment, times relative to the decoded samples; ``end`` None = runs to their end."""

    start: float
    end: float | None
    text: str
    words: list[tuple[float, float, str, float | None]] | None = None  # (start, end, word, probability)


@dataclass
class FileState:
    """What a decoder may carry from one window of a file to the next (the detected language)."""

    language: str | None
    previous: str = ""  # the text decoded so far (its tail prompts the next window, as Whisper does)


class SpeechEngine(ABC):
    """A speech recognition model on one runtime, loaded with its weights.

    Facts, set by the subclass: ``runtime`` (its name in the RUNTIMES table), ``card``,
    ``device`` and ``dtype`` (what the engine actually chose, for the run log), ``sample_rate``
    (of the samples ``decode`` takes), ``default_language`` (reported when none is detected),
    ``takes_language`` (False for models that are given no language or task, such as CTC: the
    language checks then do not apply), ``multilingual`` and ``languages()``.
    """

    runtime: str = ""
    card: ModelCard
    device: str
    dtype: str
    sample_rate: int = 16000
    default_language: str = "en"
    takes_language: bool = True
    multilingual: bool = False

    @abstractmethod
    def __init__(self, card: ModelCard, device: str, dtype: str) -> None:
        """Load the weights of ``card``; a model that cannot load, or a device or dtype the
        runtime cannot use, raises TaskError."""

    @classmethod
    def load(cls, card: ModelCard, device: str, dtype: str) -> SpeechEngine:
        """The engine for ``card``, loaded once per process: a chain or a batch reads the weights once."""
        return cached_model(card, cls.runtime, device, dtype, "speech-engine", lambda: cls(card, device, dtype))

    def languages(self) -> list[str]:
        """Language codes the model knows (multilingual models)."""
        return []

    def check_options(self, options: Any) -> None:
        """Raise TaskError for options this runtime cannot honour (before any audio is read).
        The language and translate checks every engine shares are the pipeline's, not this. By
        default an engine honours every option."""
        return None

    # The most windows ``decode_batch`` takes at once (--batch-size is capped to it): 1 = the
    # engine decodes one window at a time, whatever --batch-size says
    batch_windows: int = 1

    # Seconds of packed speech one ``decode`` call may take (None: the task's --chunk-s, at most
    # 30 s). An engine whose decoder walks a longer stretch itself, seeking from each window's
    # last timestamp and prompting with the tokens it just decoded (faster-whisper's loop), sets
    # more: the pipeline then hands it many windows' worth of a file's speech at once.
    seek_window_s: float | None = None

    def decode_batch(self, windows: list[np.ndarray], options: Any, state: FileState) -> list[list[Piece]]:
        """Several consecutive windows of one file, each prompted with ``state.previous`` (the
        text before the first of them); pieces per window. This default decodes them one by one;
        an engine that can batch overrides it and sets ``batch_windows``."""
        out = []
        for w in windows:
            out.append(list(self.decode(w, options, state)))
        return out

    def _tail(
        self,
        samples: np.ndarray,
        pieces: list[Piece],
        options: Any,
        state: FileState,
        decode: Callable[[np.ndarray, Any, FileState], Iterable[Piece]] | None = None,
    ) -> list[Piece]:
        """The speech after the last timestamp of a window decoded in one pass, decoded on until
        none is left (``decode``: one pass over samples, by default ``self.decode``). Whisper
        often stops before the last words of a full 30 s window, which the sequential decoder
        picks up by seeking to its last timestamp and decoding on. The window holds only speech
        (VAD packed it), so more than TAIL_S left over is words still to hear; a last piece that
        runs to the window's end (``end`` None) leaves none, and a window without a timed piece
        (silence by Whisper's no-speech rule) is not decoded again. Each pass starts later than
        the one before, prompted with the text so far."""
        decode = decode or self.decode
        out: list[Piece] = []
        offset, text = 0.0, state.previous
        while pieces and all(p.end is not None for p in pieces):
            done = max(p.end for p in pieces)
            if done <= 0 or len(samples) / self.sample_rate - (offset + done) <= TAIL_S:
                break
            text = (text + " " + " ".join(p.text.strip() for p in pieces))[-PROMPT_CHARS:]
            offset += done
            pieces = list(decode(samples[int(offset * self.sample_rate) :], options, FileState(state.language, text)))
            out += [
                Piece(
                    offset + p.start,
                    None if p.end is None else offset + p.end,
                    p.text,
                    None if p.words is None else [(offset + a, offset + b, w, pr) for a, b, w, pr in p.words],
                )
                for p in pieces
            ]
        return out

    @abstractmethod
    def decode(self, samples: np.ndarray, options: Any, state: FileState) -> Iterator[Piece]:
        """Transcribe one window (at most 30 s of float32 mono at ``sample_rate``, or
        ``seek_window_s`` of packed speech for an engine that seeks through it) into pieces
        timed from its first sample, in order. ``state`` is the file's: set ``state.language``
        when the model detects it (once per file), and prompt with ``state.previous``."""
