"""Reading audio for speech models in bounded memory: decode → mono → resample → chunks.

A file is decoded in blocks (by soundfile for wav, flac, ogg and mp3; by PyAV, in av_audio.py,
for what libsndfile cannot read: m4a/mp4/aac, webm/mkv, opus, wma, a video's audio track), mixed
to mono, resampled by soxr's streaming resampler (a real band-limited resampler, not
interpolation), and cut into chunks of at most ``chunk_s`` seconds. Each cut falls at the quietest moment in the last ``seam_s`` seconds of the window, so a
word is not split between two chunks and the chunks tile the audio exactly: nothing is lost and
nothing is decoded twice. Only about one chunk of audio is ever held, whatever the file's length.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from taskrun.tasks.audio_files import AudioInfo, probe  # the header probe lives with the task's checks
from taskrun.tasks.base import TaskError

BLOCK_S = 10.0  # seconds decoded per read: small enough to bound memory, large enough to be fast
FRAME_S = 0.02  # energy frame for choosing cut points
QUIET_WINDOW_S = 0.2  # a cut needs this much quiet around it, not one silent sample


@dataclass(frozen=True)
class Chunk:
    """A piece of the audio at the model's rate; ``start`` is its offset in the file (samples)."""

    start: int
    samples: np.ndarray  # float32 mono
    sr: int

    @property
    def start_s(self) -> float:
        return self.start / self.sr

    @property
    def end_s(self) -> float:
        return (self.start + len(self.samples)) / self.sr


SHORT_S = 0.1  # decoded this much less than the header declares: the file was cut short


@dataclass
class ReadStats:
    """What reading one file found wrong with it, for the pipeline to report as Notices: samples
    that were not numbers, and audio the header declares but the file does not hold."""

    samplerate: int = 0
    frames: int = 0  # decoded, at the file's own rate
    expected: int | None = None  # what the header declares (None: it does not say)
    ended: bool = True  # False: an Ogg stream without its end page
    nonfinite: int = 0  # NaN or ±inf samples, zeroed
    first_nonfinite_s: float | None = None
    error: str | None = None  # the decoder's error when it stopped before the end
    damage: str | None = None  # what the container walk found (pages failing their checksum)

    @property
    def missing_s(self) -> float | None:
        """Seconds declared but not decoded; None when the header does not say how long it is."""
        if self.expected is None or not self.samplerate:
            return None
        return max(0, self.expected - self.frames) / self.samplerate

    @property
    def short(self) -> bool:
        """Whether the file held less audio than its header declares (cut or damaged)."""
        return bool(self.error or self.damage) or not self.ended or (self.missing_s or 0.0) > SHORT_S

    def notices(self, path: str, allowed: bool) -> list[tuple[str, bool]]:
        """(message, partial) pairs: one for zeroed samples, one for a file cut short."""
        out = []
        if self.nonfinite:
            out.append(
                (
                    f"{path}: {self.nonfinite} samples were not numbers (NaN or infinity), the first at "
                    f"{self.first_nonfinite_s:.2f} s; they were read as silence. The file was "
                    f"written by a faulty program: re-export it to be sure of the transcript",
                    False,
                )
            )
        if self.short:
            got = self.frames / self.samplerate if self.samplerate else 0.0
            why = (
                f"decoding stopped: {self.error}"
                if self.error
                else self.damage
                or (
                    "its last page is missing"
                    if not self.ended
                    else f"its header declares {self.expected / self.samplerate:.1f} s"
                )
            )
            tail = (
                "Accepted: --allow-partial was given"
                if allowed
                else "The job exits non-zero; pass --allow-partial to accept a partial transcript"
            )
            out.append(
                (
                    f"{path} is cut short or damaged ({why}); transcribed the {got:.1f} s that "
                    f"could be decoded. {tail}",
                    True,
                )
            )
        return out


def read_blocks(
    path: str | Path | AudioInfo, sr: int, block_s: float = BLOCK_S, stats: ReadStats | None = None
) -> Iterator[np.ndarray]:
    """The file as float32 mono blocks at ``sr`` Hz; memory stays at one block however long it is.
    ``path`` may be the file's :class:`AudioInfo` when it was probed already.

    Samples that are not numbers (NaN, ±inf) are read as silence and samples beyond full scale
    are clipped to it, as a player would: one such sample otherwise blinds a speech model's
    level normalisation to a whole window. With ``stats``, a file that stops decoding part-way is
    read as far as it goes and ``stats`` says what was missing; without, that is a TaskError.
    """
    import soxr

    info = path if isinstance(path, AudioInfo) else probe(path)
    path = info.path
    st = stats if stats is not None else ReadStats()
    st.samplerate, st.ended, st.damage = info.samplerate, info.ended, info.damage
    st.expected = info.expected_frames if info.decoder == "soundfile" else None  # PyAV's is an estimate
    block = max(1, int(block_s * info.samplerate))
    resampler = (
        None if info.samplerate == sr else soxr.ResampleStream(info.samplerate, sr, 1, dtype="float32", quality="HQ")
    )
    try:
        for mono in _native_blocks(info, block):
            mono = _sanitised(mono, st)
            st.frames += len(mono)
            if resampler is not None:
                mono = resampler.resample_chunk(np.ascontiguousarray(mono), last=False)
            if len(mono):
                yield np.ascontiguousarray(mono, dtype=np.float32)
    except TaskError:
        raise
    except Exception as exc:  # a decode failure part-way through: a truncated or damaged file
        where = f" after {st.frames / info.samplerate:.1f} s" if st.frames else ""
        if stats is None or not st.frames:
            raise TaskError(
                f"{path} could not be decoded{where} ({exc or type(exc).__name__}); the file "
                f"is corrupt or truncated: re-export it"
            ) from None
        st.error = f"{str(exc).strip() or type(exc).__name__}{where}"
    tail = resampler.resample_chunk(np.zeros(0, np.float32), last=True) if resampler else []
    if len(tail):  # the resampler's filter delay, flushed
        yield np.ascontiguousarray(tail, dtype=np.float32)


def _sanitised(mono: np.ndarray, st: ReadStats) -> np.ndarray:
    """``mono`` with NaN/inf zeroed (counted in ``st``) and clipped to [-1, 1]."""
    bad = ~np.isfinite(mono)
    if bad.any():
        if st.first_nonfinite_s is None:
            st.first_nonfinite_s = (st.frames + int(np.argmax(bad))) / max(1, st.samplerate)
        st.nonfinite += int(bad.sum())
        mono = np.where(bad, np.float32(0), mono)
    return np.clip(mono, -1.0, 1.0, dtype=np.float32)


def _native_blocks(info: AudioInfo, block: int) -> Iterator[np.ndarray]:
    """Mono float32 blocks at the file's own rate, from the decoder that reads it."""
    if info.decoder == "av":
        from taskrun.pipelines.speech import av_audio

        yield from av_audio.blocks(info.path, block, info.samplerate)
        return
    import soundfile as sf

    step = max(1, min(block, info.samplerate))  # 1 s reads: a decode error loses at most 1 s
    with sf.SoundFile(info.path) as f:
        pending: list[np.ndarray] = []
        held = 0
        while True:
            try:
                data = f.read(step, dtype="float32", always_2d=True)
            except Exception:
                if pending:  # what decoded before the damage is audio all the same
                    yield np.concatenate(pending)
                raise
            if len(data):
                pending.append(data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0])
                held += len(data)
            if held >= block or (len(data) < step and pending):
                yield np.concatenate(pending) if len(pending) > 1 else pending[0]
                pending, held = [], 0
            if len(data) < step:
                break


def read_audio(path: str | Path, sr: int) -> np.ndarray:
    """The whole file as one float32 mono array at ``sr`` Hz (for short clips and tests)."""
    blocks = list(read_blocks(path, sr))
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)


def quietest_cut(x: np.ndarray, lo: int, hi: int, sr: int) -> int:
    """A sample in [lo, hi) in the middle of the longest quietest stretch: the middle of a pause
    keeps the pause's edges (a word's first and last sounds) with their words."""
    frame = max(1, int(FRAME_S * sr))
    seg = x[lo:hi]
    n = len(seg) // frame
    if n < 2:
        return hi
    energy = (seg[: n * frame].reshape(n, frame) ** 2).mean(axis=1)
    k = max(1, int(QUIET_WINDOW_S / FRAME_S))
    smooth = np.convolve(energy, np.ones(k) / k, mode="same") if n >= k else energy
    quiet = smooth <= smooth.min() * 2 + 1e-10  # within 3 dB of the quietest frame
    best, run_start, best_len = n - 1, None, 0
    for i, q in enumerate(np.append(quiet, False)):
        if q and run_start is None:
            run_start = i
        elif not q and run_start is not None:
            if i - run_start >= best_len:  # ties go to the later run: chunks stay long
                best, best_len = (run_start + i - 1) // 2, i - run_start
            run_start = None
    return lo + best * frame + frame // 2


def chunked(blocks: Iterator[np.ndarray], sr: int, chunk_s: float, seam_s: float) -> Iterator[Chunk]:
    """Cut a stream of blocks into chunks of at most ``chunk_s`` seconds that tile it exactly,
    each cut at the quietest point of its last ``seam_s`` seconds."""
    limit = int(chunk_s * sr)
    seam = min(int(seam_s * sr), limit // 2)
    buf = np.zeros(0, np.float32)
    start = 0
    for block in blocks:
        buf = np.concatenate([buf, block]) if len(buf) else block
        while len(buf) > limit:
            cut = quietest_cut(buf, limit - seam, limit, sr)
            yield Chunk(start, buf[:cut].copy(), sr)
            buf, start = buf[cut:], start + cut
    if len(buf):
        yield Chunk(start, buf.copy(), sr)


def is_silent(x: np.ndarray, floor_db: float = -60.0) -> bool:
    """True when the chunk never rises above ``floor_db`` dBFS (RMS over 20 ms frames): there is
    nothing for a speech model to hear, and decoding it only invites invented words."""
    if not len(x):
        return True
    frame = 320
    n = max(1, len(x) // frame)
    rms = (
        np.sqrt((x[: n * frame].reshape(n, -1) ** 2).mean(axis=1))
        if len(x) >= frame
        else np.sqrt(np.array([np.mean(x**2)]))
    )
    return float(rms.max()) < 10 ** (floor_db / 20)


_SPANS: OrderedDict[tuple, list[tuple[int, int]]] = OrderedDict()  # speech_spans' last answers
_SPANS_KEEP = 2
_SPANS_LOCK = threading.Lock()


def speech_spans(x: np.ndarray, sr: int) -> list[tuple[int, int]]:
    """Voice activity in a chunk as (start, end) samples, by Silero VAD (shipped in faster-whisper;
    its ONNX session is built once per process).

    The last two answers are kept, keyed by the samples' hash: the language check
    (language.first_speech) runs VAD on a file's first chunk just before the pipeline reads the
    same chunk again. Silero costs ~65 ms per 30 s chunk on 2 cores; the hash (blake2b) ~2 ms."""
    key = (sr, len(x), hashlib.blake2b(np.ascontiguousarray(x, np.float32).data, digest_size=16).digest())
    with _SPANS_LOCK:
        if key in _SPANS:
            _SPANS.move_to_end(key)
            return list(_SPANS[key])
    spans = _silero_spans(x, sr)
    with _SPANS_LOCK:
        _SPANS[key] = spans
        while len(_SPANS) > _SPANS_KEEP:
            _SPANS.popitem(last=False)
    return list(spans)


def _silero_spans(x: np.ndarray, sr: int) -> list[tuple[int, int]]:
    from taskrun.pipelines.device import import_ctranslate2

    import_ctranslate2()  # faster_whisper imports CTranslate2, whose libgomp reads its policy once
    from faster_whisper import vad

    if sr != 16000:
        raise ValueError("Silero VAD expects 16 kHz audio")
    # 400 ms of padding as faster-whisper uses: a tighter cut clips the first sound of a word.
    opts = vad.VadOptions(min_silence_duration_ms=500, speech_pad_ms=400, min_speech_duration_ms=150)
    spans = [(int(s["start"]), int(s["end"])) for s in vad.get_speech_timestamps(x, opts, sampling_rate=sr)]
    _trim_heap()
    return spans


@lru_cache(maxsize=1)
def _malloc_trim():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def _trim_heap() -> None:
    """Hand the memory freed by VAD back to the OS (glibc). Silero's ONNX session allocates and
    frees several MB per chunk in sizes that vary with the chunk, and glibc keeps them: over an hour
    of audio the job's peak RSS grew by ~55 MB (measured on a 1 h m4a); trimmed after each chunk it
    stays within a few MB of a one-minute file's. A call costs well under a millisecond."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
