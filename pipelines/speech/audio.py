"""Reading audio for speech models in bounded memory: decode → mono → resample → chunks.

A file is decoded in blocks (by soundfile for wav, flac, ogg and mp3; by PyAV, in av_audio.py,
for what libsndfile cannot read: m4a/mp4/aac, webm/mkv, opus, wma, a video's audio track), mixed
to mono, resampled by soxr's streaming resampler (a real band-limited resampler, not
interpolation), and cut into chunks of at most ``chunk_s`` seconds. Each cut falls at the quietest moment in the last ``seam_s`` seconds of the window, so a
word is not split between two chunks and the chunks tile the audio exactly: nothing is lost and
nothing is decoded twice. Only about one chunk of audio is ever held, whatever the file's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

from taskrun.tasks.base import TaskError

BLOCK_S = 10.0  # seconds decoded per read: small enough to bound memory, large enough to be fast
FRAME_S = 0.02  # energy frame for choosing cut points
QUIET_WINDOW_S = 0.2  # a cut needs this much quiet around it, not one silent sample


@dataclass(frozen=True)
class AudioInfo:
    path: str
    samplerate: int
    channels: int
    frames: int | None  # None: the container does not say (a browser's webm); the reader finds out
    format: str
    decoder: str = "soundfile"  # or "av" (PyAV)

    @property
    def duration_s(self) -> float:
        return self.frames / self.samplerate if self.samplerate and self.frames else 0.0


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


def probe(path: str | Path) -> AudioInfo:
    """What the file holds, or a TaskError that says what is wrong with it and what to do."""
    import soundfile as sf

    p = Path(path)
    if not p.exists():
        raise TaskError(f"{p}: no such file")
    if p.stat().st_size == 0:
        raise TaskError(f"{p} is empty (0 bytes); give a recording")
    try:
        info = sf.info(str(p))
    except Exception as exc:  # libsndfile reports every failure as one error type with a message
        return _probe_av(p, exc)
    if info.samplerate <= 0:
        raise TaskError(f"{p} declares a sample rate of {info.samplerate} Hz; the header is broken. "
                        f"Re-export the file (e.g. `sox in.wav -r 16000 out.wav`)")
    if info.channels <= 0:
        raise TaskError(f"{p} declares {info.channels} channels; the header is broken. Re-export the file")
    return AudioInfo(str(p), int(info.samplerate), int(info.channels), int(info.frames), info.format)


def _probe_av(p: Path, sf_error: Exception) -> AudioInfo:
    """What libsndfile could not read, through PyAV; when neither can, the error says why."""
    from taskrun.pipelines.speech import av_audio

    if _wav_header_rate(_head(p)) == 0:  # FFmpeg would guess a rate: refuse, as sf does
        raise _read_error(p, sf_error)
    try:
        rate, channels, frames, name = av_audio.probe(p)
    except ValueError:
        raise _read_error(p, sf_error) from None
    if rate <= 0 or channels <= 0:
        raise TaskError(f"{p} declares {rate} Hz and {channels} channels; the header is broken. "
                        f"Re-export the file")
    return AudioInfo(str(p), rate, channels, frames, name, decoder="av")


def _read_error(p: Path, exc: Exception) -> TaskError:
    from taskrun.tasks.inputs import sniff_bytes

    head = _head(p)
    msg = str(exc).split(":", 1)[-1].strip() or type(exc).__name__
    rate = _wav_header_rate(head)
    if rate == 0:
        return TaskError(f"{p} declares a sample rate of 0 Hz; the header is broken. Re-export the file "
                         f"(e.g. `sox -r 16000 -e signed -b 16 -c 1 -t raw <data> out.wav` if you know the rate)")
    if sniff_bytes(head) == "audio":
        return TaskError(f"{p} looks like audio but cannot be decoded ({msg}); the file is corrupt or "
                         f"truncated, or its codec is unsupported: re-export it as wav, flac or m4a")
    return TaskError(f"{p} is not an audio file taskrun can read ({msg}); give wav, flac, ogg, mp3, "
                     f"m4a, opus, webm or a video with sound")


def _head(p: Path) -> bytes:
    """The first bytes of a file, without reading the rest (a recording can be gigabytes)."""
    with open(p, "rb") as f:
        return f.read(64)


def _wav_header_rate(head: bytes) -> int | None:
    """The sample rate field of a canonical WAV header, read by hand: libsndfile refuses a file
    whose rate is 0 with a message that does not say so."""
    import struct

    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and head[12:16] == b"fmt " and len(head) >= 28:
        return struct.unpack_from("<I", head, 24)[0]
    return None


def read_blocks(path: str | Path, sr: int, block_s: float = BLOCK_S) -> Iterator[np.ndarray]:
    """The file as float32 mono blocks at ``sr`` Hz; memory stays at one block however long it is."""
    import soxr

    info = probe(path)
    block = max(1, int(block_s * info.samplerate))
    resampler = None if info.samplerate == sr else soxr.ResampleStream(
        info.samplerate, sr, 1, dtype="float32", quality="HQ")
    got = 0
    try:
        for mono in _native_blocks(info, block):
            got += len(mono)
            if resampler is not None:
                mono = resampler.resample_chunk(np.ascontiguousarray(mono), last=False)
            if len(mono):
                yield np.ascontiguousarray(mono, dtype=np.float32)
        tail = resampler.resample_chunk(np.zeros(0, np.float32), last=True) if resampler else []
        if len(tail):  # the resampler's filter delay, flushed
            yield np.ascontiguousarray(tail, dtype=np.float32)
    except TaskError:
        raise
    except Exception as exc:  # a decode failure part-way through: a truncated or damaged file
        where = f" after {got / info.samplerate:.1f} s" if got else ""
        raise TaskError(f"{path} could not be decoded{where} ({exc}); the file is corrupt or "
                        f"truncated: re-export it") from None


def _native_blocks(info: AudioInfo, block: int) -> Iterator[np.ndarray]:
    """Mono float32 blocks at the file's own rate, from the decoder that reads it."""
    if info.decoder == "av":
        from taskrun.pipelines.speech import av_audio

        yield from av_audio.blocks(info.path, block, info.samplerate)
        return
    import soundfile as sf

    with sf.SoundFile(info.path) as f:
        while True:
            data = f.read(block, dtype="float32", always_2d=True)
            if len(data):
                yield data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
            if len(data) < block:
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
    rms = np.sqrt((x[: n * frame].reshape(n, -1) ** 2).mean(axis=1)) if len(x) >= frame else \
        np.sqrt(np.array([np.mean(x ** 2)]))
    return float(rms.max()) < 10 ** (floor_db / 20)


def speech_spans(x: np.ndarray, sr: int) -> list[tuple[int, int]]:
    """Voice activity in a chunk as (start, end) samples, by Silero VAD (shipped in faster-whisper;
    its ONNX session is built once per process)."""
    from taskrun.pipelines.device import configure_openmp

    configure_openmp()  # faster_whisper imports CTranslate2, whose libgomp reads the policy once
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
