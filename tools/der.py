"""Diarization error rate: (missed + false alarm + speaker confusion) ÷ reference speech, scored
on a 10 ms grid outside a collar around each reference boundary (0.25 s, the usual), with the
best one-to-one map of hypothesis to reference labels (Hungarian, scipy)."""

from __future__ import annotations

import numpy as np

STEP = 0.01


def read_rttm(text: str) -> list[tuple[float, float, str]]:
    """(start, end, speaker) per SPEAKER line, by the format's field rules (10 fields, type
    SPEAKER, onset and duration in seconds, the name in field 8)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        assert len(f) == 10 and f[0] == "SPEAKER", f"not an RTTM SPEAKER line: {line!r}"
        onset, dur = float(f[3]), float(f[4])
        assert onset >= 0 and dur > 0, line
        out.append((onset, onset + dur, f[7]))
    return out


def der(ref: list[tuple[float, float, str]], hyp: list[tuple[float, float, str]], collar: float = 0.25) -> float:
    from scipy.optimize import linear_sum_assignment

    end = max([b for _, b, _ in ref + hyp] + [0.0])
    n = int(np.ceil(end / STEP)) + 1
    rl, hl = sorted({s for *_, s in ref}), sorted({s for *_, s in hyp})
    r = np.zeros((n, len(rl)), bool)
    h = np.zeros((n, max(1, len(hl))), bool)
    keep = np.ones(n, bool)
    for a, b, s in ref:
        r[int(a / STEP) : int(b / STEP), rl.index(s)] = True
        for t in (a, b):
            keep[max(0, int((t - collar) / STEP)) : int((t + collar) / STEP)] = False
    for a, b, s in hyp:
        h[int(a / STEP) : int(b / STEP), hl.index(s)] = True
    r, h = r[keep], h[keep]
    overlap = r.T.astype(int) @ h.astype(int)  # frames where ref i and hyp j both speak
    ri, hj = linear_sum_assignment(-overlap)
    correct = overlap[ri, hj].sum()
    nr, nh = r.sum(1), h.sum(1)
    total = nr.sum()
    errors = np.maximum(nr, nh).sum() - correct  # missed + false alarm + confusion, per frame
    return float(errors / max(1, total))
