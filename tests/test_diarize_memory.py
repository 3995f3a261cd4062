"""Long input, bounded memory: the Diarizer fed a file's chunks as they are read keeps only each
window's embedding, so its peak and what it holds do not grow with the audio's length. Real
speech (samples/meeting.wav tiled) through the real mel front-end of the GE2E encoder
(speakers.mel_power); only the network is left out, so 30 minutes run in seconds on 2 cores."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import soundfile as sf

from taskrun.pipelines.speech.diarize import Diarizer
from taskrun.pipelines.speech.speakers import mel_power
from tests.test_transcribe import SAMPLES

pytestmark = pytest.mark.real
CHUNK_S = 30


class MelEmbedder:
    """The encoder's own features per window, pooled to a 256-d unit vector (GE2E's size)."""

    def embed(self, wins):
        out = np.zeros((len(wins), 256), np.float32)
        for i, w in enumerate(wins):
            m = np.log1p(mel_power(w)).mean(0)
            out[i, : len(m)] = m / (np.linalg.norm(m) or 1.0)
        return out


def feed(minutes: int) -> tuple[int, int, int]:
    """(peak bytes while feeding, bytes the Diarizer holds after, windows) for `minutes` of speech."""
    x, sr = sf.read(SAMPLES / "meeting.wav", dtype="float32")
    chunk = CHUNK_S * sr
    tracemalloc.start()
    d = Diarizer(MelEmbedder(), sr)
    base = tracemalloc.get_traced_memory()[0]
    for k in range(minutes * 60 // CHUNK_S):
        a = (k * chunk) % (len(x) - chunk)
        piece = x[a : a + chunk].copy()  # one chunk read at a time, as the pipeline reads a file
        d.add(piece, k * chunk, [(0, chunk)])
        del piece
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - base, held - base, len(d.times)


def test_diarizer_memory_does_not_grow_with_length():
    p10, h10, n10 = feed(10)
    p30, h30, n30 = feed(30)
    assert n30 >= 2.9 * n10  # three times the windows were embedded
    audio_30 = 30 * 60 * 16000 * 4  # 115 MB of float32 samples; their mel features ~29 MB
    assert h30 <= 3 * 1024 * n30, (h30, n30)  # ~1 KB an embedding kept, no audio nor features
    assert h30 < audio_30 / 40
    assert p30 <= 1.2 * p10, (p10, p30)  # peak set by one chunk, not by the file's length
