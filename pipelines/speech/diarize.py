"""Who spoke when: speaker windows cut from the VAD's speech spans as a file is read, embedded in
batches by a :class:`SpeakerEngine` (so a long file holds only its embeddings, 1 KB per window),
clustered at the file's end, and the labels laid onto the transcript's segments and words.

Clustering is numpy only: average-linkage agglomerative clustering on cosine similarity (the
default; spectral clustering with an eigengap count is here too, measured less accurate), stopped
at a threshold (or at ``--num-speakers``, within ``--min/--max-speakers``). Labels are numbered
SPEAKER_1, SPEAKER_2, … in order of first speech, so reruns give the same names.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from taskrun.tasks.transcribe import Segment, Word

WIN_S = 3.0  # longest window embedded: long spans are split into equal pieces of 1.5-3 s
MIN_S = 0.5  # shorter speech gives no embedding of its own; it takes its neighbours' label
# Average cosine similarity above which two clusters are one voice. GE2E on meeting.wav's 19 windows
# of 1.5-3 s: same voice 0.79 mean, different 0.61; thresholds 0.65-0.70 all gave its 3 voices
# exactly (0.60: 2, 0.72: 4), so the middle of that range. One recording: provisional.
THRESHOLD = 0.68
SPEAKER_MODEL = "resemblyzer-ge2e"
# Spectral clustering (below) was measured against the average linkage on meeting.wav's windows
# cut at its reference turns (benchmarks/bench_speakers.py --clustering): linkage 3 voices, all
# windows right; spectral + eigengap 2 voices (0.944 of windows right) at every pruning 0.15-0.5,
# and 5-6 voices for one reader below 0.35. So the linkage stays the default.
PRUNE = 0.35  # spectral: each row keeps its closest 35 % of windows (NME-SC-style p-pruning)


def split_span(a: int, b: int, sr: int) -> list[tuple[int, int]]:
    """A speech span [a, b) in samples → windows of WIN_S at most, equal in length."""
    n = max(1, math.ceil((b - a) / (WIN_S * sr)))
    step = (b - a) / n
    return [(a + round(k * step), a + round((k + 1) * step)) for k in range(n)]


def cluster(emb: np.ndarray, num: int | None = None, lo: int = 1, hi: int | None = None, threshold: float = THRESHOLD):
    """Cluster ids per row of ``emb`` (unit vectors): average linkage on cosine similarity, merged
    while the closest pair is above ``threshold`` (or until ``num`` clusters), never below ``lo``
    nor above ``hi`` clusters. Ids are 0.. in order of first row."""
    n = len(emb)
    if n == 0:
        return np.zeros(0, int)
    # Average linkage kept as a matrix of cluster-to-cluster mean similarity, updated on each
    # merge (Lance-Williams): O(n²) a merge in numpy, so an hour's ~1500 windows take seconds
    sim = (emb @ emb.T).astype(np.float64)
    np.fill_diagonal(sim, -np.inf)
    size = np.ones(n)
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    target_lo = max(1, num if num else lo)
    target_hi = num if num else (hi or n)
    while len(members) > target_lo:
        i, j = divmod(int(np.argmax(sim)), n)
        i, j = min(i, j), max(i, j)
        if len(members) <= target_hi and sim[i, j] < threshold:
            break
        row = (size[i] * sim[i] + size[j] * sim[j]) / (size[i] + size[j])
        sim[i], sim[:, i] = row, row
        sim[j], sim[:, j] = -np.inf, -np.inf
        sim[i, i] = -np.inf
        size[i] += size[j]
        members[i] += members.pop(j)
    groups = list(members.values())
    labels = np.zeros(n, int)
    for g in groups:
        labels[g] = min(g)
    _, first = np.unique(labels, return_index=True)
    order = {labels[k]: rank for rank, k in enumerate(sorted(first))}
    return np.array([order[v] for v in labels])


def spectral(emb: np.ndarray, num: int | None = None, lo: int = 1, hi: int | None = None, prune: float = PRUNE):
    """Cluster ids per row of ``emb`` (unit vectors) by spectral clustering: the cosine affinity
    (negatives 0) pruned to each row's closest ``prune`` share and symmetrised, its normalised
    Laplacian's eigenvectors, the count from the largest eigengap within [lo, hi] (or ``num``),
    and k-means on the rows of the first k eigenvectors (farthest-point start: deterministic).
    Ids are 0.. in order of first row."""
    n = len(emb)
    if n < 2:
        return np.zeros(n, int)
    aff = np.clip(emb @ emb.T, 0, None).astype(np.float64)
    keep = np.argsort(-aff, axis=1)[:, : max(2, round(prune * n))]
    mask = np.zeros_like(aff)
    np.put_along_axis(mask, keep, 1.0, 1)
    aff = aff * mask
    aff = (aff + aff.T) / 2
    np.fill_diagonal(aff, 0.0)
    deg = np.maximum(aff.sum(1), 1e-12)
    lap = np.eye(n) - aff / np.sqrt(np.outer(deg, deg))
    w, v = np.linalg.eigh(lap)
    top = min(hi or n - 1, n - 1)
    lo = max(1, min(lo, top))
    k = min(num, n) if num else int(np.argmax(np.diff(w[: top + 1])[lo - 1 :]) + lo)
    y = v[:, :k] / np.maximum(np.linalg.norm(v[:, :k], axis=1, keepdims=True), 1e-12)
    start = [0]
    for _ in range(1, k):
        start.append(int(np.argmax(np.min(((y[:, None] - y[start][None]) ** 2).sum(-1), 1))))
    cent = y[start]
    for _ in range(100):
        ids = np.argmin(((y[:, None] - cent[None]) ** 2).sum(-1), 1)
        new = np.array([y[ids == j].mean(0) if (ids == j).any() else cent[j] for j in range(k)])
        if np.allclose(new, cent):
            break
        cent = new
    _, first = np.unique(ids, return_index=True)
    order = {ids[i]: rank for rank, i in enumerate(sorted(first))}
    return np.array([order[c] for c in ids])


METHODS = {"linkage": cluster, "spectral": spectral}


@dataclass
class Diarizer:
    """One file's speaker windows: fed each chunk's speech spans, embeds them a chunk at a time."""

    engine: object  # a SpeakerEngine
    sr: int = 16000
    times: list[tuple[float, float]] = field(default_factory=list)  # window (start, end), file seconds
    embs: list[np.ndarray] = field(default_factory=list)
    seconds: float = 0.0  # time spent embedding and clustering: the diarize_s metric

    def add(self, x: np.ndarray, offset: int, spans: list[tuple[int, int]]) -> None:
        t = time.perf_counter()
        wins, times = [], []
        for a, b in spans:
            for wa, wb in split_span(a, b, self.sr):
                if wb - wa >= MIN_S * self.sr:
                    wins.append(x[wa:wb])
                    times.append(((offset + wa) / self.sr, (offset + wb) / self.sr))
        if wins:
            self.embs.append(self.engine.embed(wins))
            self.times += times
        self.seconds += time.perf_counter() - t

    def turns(self, num=None, lo=1, hi=None, method: str = "linkage") -> list[tuple[float, float, str]]:
        """(start, end, SPEAKER_k) per window, in time order; ``method``: a key of METHODS."""
        if method not in METHODS:
            raise ValueError(f"unknown clustering {method!r}: use one of {', '.join(METHODS)}")
        t = time.perf_counter()
        emb = np.concatenate(self.embs) if self.embs else np.zeros((0, 1), np.float32)
        ids = METHODS[method](emb, num, lo, hi)
        self.seconds += time.perf_counter() - t
        return [(a, b, f"SPEAKER_{k + 1}") for (a, b), k in zip(self.times, ids)]


def speaker_at(turns: list[tuple[float, float, str]], a: float, b: float) -> str | None:
    """The label that overlaps [a, b] most; the nearest window's when none overlaps."""
    if not turns:
        return None
    best, label = 0.0, None
    for ta, tb, lab in turns:
        ov = min(b, tb) - max(a, ta)
        if ov > best:
            best, label = ov, lab
    if label is None:
        mid = (a + b) / 2
        label = min(turns, key=lambda t: min(abs(mid - t[0]), abs(mid - t[1])))[2]
    return label


def label(segments: list[Segment], turns: list[tuple[float, float, str]]) -> list[Segment]:
    """Segments with speakers: each word takes the voice it overlaps most, and a segment whose
    words change voice is split at that word (the change point refined to word timestamps)."""
    out: list[Segment] = []
    for s in segments:
        if not s.words:
            out.append(replace(s, speaker=speaker_at(turns, s.start, s.end)))
            continue
        words = [replace(w, speaker=speaker_at(turns, w.start, w.end)) for w in s.words]
        run: list[Word] = [words[0]]
        for w in words[1:]:
            if w.speaker != run[-1].speaker:
                out.append(_piece(s, run, out))
                run = []
            run.append(w)
        out.append(_piece(s, run, out))
    return out


def _piece(s: Segment, words: list[Word], done: list[Segment]) -> Segment:
    whole = len(words) == len(s.words or ())
    start = s.start if whole or words[0] is s.words[0] else words[0].start  # type: ignore[index]
    end = s.end if whole or words[-1] is s.words[-1] else words[-1].end  # type: ignore[index]
    text = s.text if whole else "".join(w.word for w in words).strip()
    return Segment(start, end, text, tuple(words), speaker=words[0].speaker)
