"""Probing audio files from their headers: what a recording holds, or a one-line TaskError that
says what is wrong with it, cheaply and before any model loads (the audio twin of image_files.py).

``probe`` reads headers only (soundfile's ``info``; PyAV's container probe for what libsndfile
cannot read), plus two checks that catch a file cut short while its header still claims the
whole length, which libsndfile hides:

- WAV: libsndfile clamps the frame count to the bytes present, so the ``data`` chunk's declared
  size is read by hand (``declared_frames``);
- Ogg: the container declares no length, but a finished stream ends with a page flagged
  end-of-stream; a file without one was cut (``ended`` is False). Each page carries a checksum,
  and the decoder silently skips a page that fails it: those are counted (``damage``).

The decoders themselves (pipelines/speech/audio.py) then compare what they decoded with what was
declared. soundfile and PyAV are imported inside the functions: the CLI imports this module.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from taskrun.tasks.base import TaskError

TAIL_BYTES = 65536 + 282  # an Ogg page is at most 65,307 bytes: the last one starts in here


@dataclass(frozen=True)
class AudioInfo:
    path: str
    samplerate: int
    channels: int
    frames: int | None  # None: the container does not say (a browser's webm); the reader finds out
    format: str
    decoder: str = "soundfile"  # or "av" (PyAV)
    declared_frames: int | None = None  # a WAV header's claim when it exceeds what the file holds
    ended: bool = True  # False: an Ogg stream without its end-of-stream page (cut short)
    damage: str | None = None  # what a container walk found broken: "2 damaged Ogg pages"

    @property
    def duration_s(self) -> float:
        return self.frames / self.samplerate if self.samplerate and self.frames else 0.0

    @property
    def expected_frames(self) -> int | None:
        """How many frames a complete file would decode to, as far as its header says."""
        return max(self.frames or 0, self.declared_frames or 0) or None


def probe_input(inp) -> AudioInfo:
    """A transcribe input's header, or the TaskError saying why it is not audio with samples: the
    check before any model loads (TranscribeTask.check_input) and the pipeline's probe both use it."""
    if not inp.path:
        raise TaskError(f"{inp.source}: transcribe takes audio files, not text")
    info = probe(inp.path)
    if info.frames == 0:
        raise TaskError(f"{inp.path} holds no audio samples (0 s); give a recording with sound in it")
    return info


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
        raise TaskError(
            f"{p} declares a sample rate of {info.samplerate} Hz; the header is broken. "
            f"Re-export the file (e.g. `sox in.wav -r 16000 out.wav`)"
        )
    if info.channels <= 0:
        raise TaskError(f"{p} declares {info.channels} channels; the header is broken. Re-export the file")
    head = _head(p)
    declared = wav_declared_frames(p) if head[:4] == b"RIFF" and head[8:12] == b"WAVE" else None
    ended, damage = True, None
    if head[:4] == b"OggS":
        ended, bad, stray = ogg_check(p)
        if bad or stray:
            damage = f"{bad} damaged Ogg page{'s' if bad != 1 else ''}" + (f" and {stray} stray bytes" if stray else "")
    return AudioInfo(
        str(p),
        int(info.samplerate),
        int(info.channels),
        int(info.frames),
        info.format,
        declared_frames=declared if declared and declared > info.frames else None,
        ended=ended,
        damage=damage,
    )


def _probe_av(p: Path, sf_error: Exception) -> AudioInfo:
    """What libsndfile could not read, through PyAV; when neither can, the error says why."""
    if _wav_header_rate(_head(p)) == 0:  # FFmpeg would guess a rate: refuse, as sf does
        raise _read_error(p, sf_error)
    try:
        rate, channels, frames, name = av_probe(p)
    except ValueError:
        raise _read_error(p, sf_error) from None
    if rate <= 0 or channels <= 0:
        raise TaskError(f"{p} declares {rate} Hz and {channels} channels; the header is broken. Re-export the file")
    return AudioInfo(str(p), rate, channels, frames, name, decoder="av")


def av_probe(path: str | Path) -> tuple[int, int, int | None, str]:
    """(sample rate, channels, frames or None when the container does not say, format name) of
    the first audio stream, by PyAV (its wheels bundle FFmpeg's demuxers). Raises ValueError when
    FFmpeg cannot open the file at all, and a TaskError naming the file when it opens but holds no
    audio stream."""
    import av

    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    with container:
        if not container.streams.audio:
            others = ", ".join(f"{s.type} ({s.codec_context.name})" for s in container.streams) or "nothing"
            raise TaskError(f"{path} has no audio track (it holds {others}); transcribe needs a recording with sound")
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        if ctx is None:  # FFmpeg found an audio stream but no decoder for its codec (a damaged header)
            raise ValueError("no decoder for the audio stream")
        rate = int(ctx.sample_rate or stream.rate or 0)
        channels = int(ctx.channels or 0)
        seconds = None
        if stream.duration and stream.time_base:
            seconds = float(stream.duration * stream.time_base)
        elif container.duration:  # microseconds (AV_TIME_BASE), the container's estimate
            seconds = container.duration / 1_000_000
        frames = None if seconds is None else int(round(seconds * rate))
        name = container.format.name.split(",")[0]
        return rate, channels, frames, f"{name} ({ctx.name})"


def _read_error(p: Path, exc: Exception) -> TaskError:
    from taskrun.tasks.inputs import sniff_bytes

    head = _head(p)
    msg = str(exc).split(":", 1)[-1].strip() or type(exc).__name__
    rate = _wav_header_rate(head)
    if rate == 0:
        return TaskError(
            f"{p} declares a sample rate of 0 Hz; the header is broken. Re-export the file "
            f"(e.g. `sox -r 16000 -e signed -b 16 -c 1 -t raw <data> out.wav` if you know the rate)"
        )
    boxes = _mp4_boxes(p) if head[4:8] == b"ftyp" else None
    if boxes is not None and "mdat" in boxes and "moov" not in boxes:
        return TaskError(
            f"{p} is an unfinished recording: its audio is there, but the index that says where "
            f"(the MP4 'moov' box, written when a recording stops) is missing, as when a phone or "
            f"app is interrupted mid-recording. No decoder can read it as it is; a repair tool "
            f"such as untrunc rebuilds the index from a complete recording made the same way "
            f"(same app and settings)"
        )
    if sniff_bytes(head) == "audio":
        return TaskError(
            f"{p} looks like audio but cannot be decoded ({msg}); the file is corrupt or "
            f"truncated, or its codec is unsupported: re-export it as wav, flac or m4a"
        )
    return TaskError(
        f"{p} is not an audio file taskrun can read ({msg}); give wav, flac, ogg, mp3, "
        f"m4a, opus, webm or a video with sound"
    )


def _mp4_boxes(p: Path, most: int = 64) -> list[str] | None:
    """The top-level box types of an MP4/M4A file, walked by their headers without reading the
    payloads; None when the headers do not add up (not an MP4, or damaged). A box cut off by the
    end of the file is still listed: a recording interrupted mid-write ends inside its 'mdat'."""
    import struct

    names: list[str] = []
    size_of_file = p.stat().st_size
    with open(p, "rb") as f:
        at = 0
        while at + 8 <= size_of_file and len(names) < most:
            f.seek(at)
            size, kind = struct.unpack(">I4s", f.read(8))
            if size == 1:  # a 64-bit size follows the type
                wide = f.read(8)
                if len(wide) < 8:
                    return None
                size = struct.unpack(">Q", wide)[0]
            elif size == 0:  # the box runs to the end of the file
                size = size_of_file - at
            if size < 8 or not kind.isascii() or not kind.decode("ascii").isprintable():
                return None
            names.append(kind.decode("ascii"))
            at += size
    return names


def _head(p: Path) -> bytes:
    """The first bytes of a file, without reading the rest (a recording can be gigabytes)."""
    with open(p, "rb") as f:
        return f.read(64)


def _wav_header_rate(head: bytes) -> int | None:
    """The sample rate field of a canonical WAV header, read by hand: libsndfile refuses a file
    whose rate is 0 with a message that does not say so."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE" and head[12:16] == b"fmt " and len(head) >= 28:
        return struct.unpack_from("<I", head, 24)[0]
    return None


def wav_declared_frames(path: str | Path, max_chunks: int = 64) -> int | None:
    """Frames the ``data`` chunk of a RIFF/WAVE file declares (its size ÷ the block align of
    ``fmt ``), walking the chunk headers only; None when the header does not say (a streaming
    writer's 0 or 0xFFFFFFFF size, RF64, or a chunk list that cannot be walked)."""
    align = None
    with open(path, "rb") as f:
        f.seek(12)
        for _ in range(max_chunks):
            hdr = f.read(8)
            if len(hdr) < 8:
                return None
            cid, size = hdr[:4], struct.unpack("<I", hdr[4:])[0]
            if cid == b"fmt ":
                fmt = f.read(min(size, 16))
                if len(fmt) < 14:
                    return None
                align = struct.unpack_from("<H", fmt, 12)[0]
                f.seek(size - len(fmt) + (size & 1), 1)
            elif cid == b"data":
                if not align or size in (0, 0xFFFFFFFF):
                    return None
                return size // align
            else:
                f.seek(size + (size & 1), 1)
    return None


_BIT_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc(page: bytes) -> int:
    """Ogg's page checksum (CRC-32, polynomial 0x04C11DB7, not reflected, initial value 0),
    computed by zlib's reflected CRC-32 over the bit-reversed bytes: C speed, no extra library."""
    import zlib

    r = zlib.crc32(page.translate(_BIT_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{r:032b}"[::-1], 2)


def ogg_check(path: str | Path) -> tuple[bool, int, int]:
    """(ended, damaged pages, stray bytes) of an Ogg file, by walking its pages: a page whose
    checksum fails is dropped by the decoder (the audio jumps), stray bytes between pages are
    damage too, and a finished stream ends with a page flagged end-of-stream (a file cut short
    does not). Reads the file once, a page at a time (about 1 ms per MB)."""
    ended, bad, stray = False, 0, 0
    with open(path, "rb") as f:
        while True:
            head = f.read(27)
            if len(head) < 27:
                stray += len(head)
                break
            if head[:5] != b"OggS\0":  # lost sync: count the bytes up to the next page
                i = head.find(b"OggS", 1)
                skip = i if i > 0 else 27 - 3
                stray += skip
                f.seek(skip - 27, 1)
                continue
            segs = f.read(head[26])
            body = f.read(sum(segs))
            page = bytearray(head + segs + body)
            crc = struct.unpack_from("<I", page, 22)[0]
            page[22:26] = b"\0\0\0\0"
            if len(segs) < head[26] or len(body) < sum(segs):  # the file ends inside this page
                ended = False
                break
            if ogg_crc(bytes(page)) != crc:
                bad += 1
                ended = False
                continue
            ended = bool(head[5] & 0x04)
    return ended, bad, stray
