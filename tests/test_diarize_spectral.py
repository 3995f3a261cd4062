"""Spectral clustering with an eigengap count (diarize.spectral) next to the default linkage."""

from __future__ import annotations

import numpy as np
import pytest

from taskrun.pipelines.speech.diarize import METHODS, Diarizer, spectral


def voices(k: int, per: int = 12, dim: int = 64, spread: float = 0.25, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim))
    x = np.concatenate([c + spread * rng.normal(size=(per, dim)) * np.linalg.norm(c) / 8 for c in centres])
    x = x[rng.permutation(len(x))]
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_eigengap_finds_the_count(k):
    emb = voices(k)
    ids = spectral(emb)
    assert len(set(ids.tolist())) == k
    assert ids[0] == 0 and list(dict.fromkeys(ids.tolist())) == list(range(k))  # numbered by first row
    # the same partition as the linkage on well-separated voices
    lk = METHODS["linkage"](emb)
    assert (ids == lk).all()


def test_num_overrides_and_bounds():
    emb = voices(3)
    assert len(set(spectral(emb, num=2).tolist())) == 2
    assert len(set(spectral(emb, lo=4).tolist())) >= 4
    assert len(set(spectral(emb, lo=4, hi=5).tolist())) in (4, 5)
    assert len(set(spectral(emb, hi=2).tolist())) == 2
    assert spectral(emb[:1]).tolist() == [0] and spectral(emb[:0]).tolist() == []


def test_diarizer_method_choice():
    class Echo:  # embeds each window as the unit vector it carries
        def embed(self, wins):
            return np.stack([w[:64] / np.linalg.norm(w[:64]) for w in wins])

    emb = voices(3, per=6)
    d = Diarizer(Echo())
    for i, e in enumerate(emb):
        x = np.zeros(16000 * 2, np.float32)
        x[:64] = e
        d.add(x, i * len(x), [(0, len(x))])
    assert (
        {t[2] for t in d.turns(method="spectral")}
        == {t[2] for t in d.turns()}
        == {"SPEAKER_1", "SPEAKER_2", "SPEAKER_3"}
    )
    with pytest.raises(ValueError, match="use one of linkage, spectral"):
        d.turns(method="kmeans")


@pytest.mark.real
def test_linkage_default_is_the_more_accurate_on_meeting():
    """Why the linkage is the default: on meeting.wav's real GE2E windows it finds the 3 readers."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_speakers import clustering

    rows = clustering()
    assert rows["linkage"]["speakers"] == rows["voices"] == 3
    assert rows["linkage"]["windows_right"] >= rows["spectral"]["windows_right"]
    assert rows["linkage"]["one_reader_speakers"] == 1
