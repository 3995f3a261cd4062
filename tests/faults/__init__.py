"""Helpers for the fault suite (tests/test_faults.py): damaged media made in code, and peak memory
measured in a child process."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

SR = 16000
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


def speech(seconds: float = 6.0) -> np.ndarray:
    """The first ``seconds`` of samples/meeting.wav as float32 mono."""
    import soundfile as sf

    x, sr = sf.read(SAMPLES / "meeting.wav", dtype="float32", frames=int(seconds * SR))
    assert sr == SR
    return x


def encoded(x: np.ndarray, fmt: str) -> bytes:
    """``x`` written by libsndfile as wav (16-bit or float), flac, ogg (Vorbis) or mp3."""
    import soundfile as sf

    buf = io.BytesIO()
    kind, sub = {
        "wav": ("WAV", "PCM_16"),
        "fwav": ("WAV", "FLOAT"),
        "flac": ("FLAC", "PCM_16"),
        "ogg": ("OGG", "VORBIS"),
        "mp3": ("MP3", "MPEG_LAYER_III"),
    }[fmt]
    sf.write(buf, x, SR, format=kind, subtype=sub)
    return buf.getvalue()


def garble_ogg_page(data: bytes, page: int = 3) -> bytes:
    """``data`` with bytes inside the body of its ``page``-th Ogg page overwritten: its checksum
    fails and the decoder silently skips it."""
    b = bytearray(data)
    at = -1
    for _ in range(page + 1):
        at = b.index(b"OggS", at + 1)
    body = at + 27 + b[at + 26] + 10
    b[body : body + 64] = bytes(range(64))
    return bytes(b)


def png_stream(path: Path, width: int, height: int, colour: tuple = (200, 180, 160)) -> Path:
    """A one-colour RGB PNG of any size, written a row at a time: the file is small (a few
    hundred KB for 10k x 10k) and making it needs no full-size image in memory."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(colour) * width
    z = zlib.compressobj(1)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
        data = b"".join(z.compress(row) for _ in range(height)) + z.flush()
        f.write(chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def peak_mb(code: str, env: dict | None = None, setup: str = "") -> tuple[float, dict]:
    """(peak RSS in MB of ``code`` alone, the JSON it printed last) in a fresh Python: ``setup``
    runs first, then the high-water mark is reset (/proc/self/clear_refs) so that only ``code``
    counts. ``code`` may set ``out`` (a dict) to report values."""
    prog = (
        f"import json, os\n{setup}\nopen('/proc/self/clear_refs', 'w').write('5')\nout = {{}}\n{code}\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "out['peak_mb'] = int(hwm) / 1024\nprint(json.dumps(out))\n"
    )
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["peak_mb"], out
