"""Vectors in the file formats other tools read: NumPy, JSON Lines, Parquet, CSV.

Each writer takes the texts and their float32 vectors and returns the file's bytes or text (the
runner writes it whole, or not at all). Text formats print each number with 9 significant digits,
the most a float32 needs, so every format reads back to exactly the array ``.npy`` holds.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any


def _matrix(vectors: Sequence[Any]):
    import numpy as np

    return np.stack(vectors).astype(np.float32) if len(vectors) else np.zeros((0, 0), np.float32)


def _numbers(row, json_null: bool = False) -> list[str]:
    """Each number to 9 significant digits; JSON has no NaN or infinity, so there they are null."""
    import math

    return [f"{x:.9g}" if not json_null or math.isfinite(x) else "null" for x in row.tolist()]


def to_npy(texts: list[str], vectors: Sequence[Any]) -> bytes:
    """An (n, dim) float32 array, rows in input order (``numpy.load``)."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, _matrix(vectors))
    return buf.getvalue()


def to_jsonl(texts: list[str], vectors: Sequence[Any]) -> str:
    """One ``{"text": ..., "vector": [...]}`` object per line (``pandas.read_json(lines=True)``)."""
    lines = [
        f'{{"text": {json.dumps(t, ensure_ascii=False)}, "vector": [{", ".join(_numbers(v, json_null=True))}]}}'
        for t, v in zip(texts, _matrix(vectors))
    ]
    return "".join(line + "\n" for line in lines)


def to_csv(texts: list[str], vectors: Sequence[Any]) -> str:
    """A header (text, v0 … v{dim-1}), then the text and one column per dimension per row."""
    m = _matrix(vectors)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["text"] + [f"v{i}" for i in range(m.shape[1])])
    for t, v in zip(texts, m):
        w.writerow([t] + _numbers(v))
    return buf.getvalue()


def to_parquet(texts: list[str], vectors: Sequence[Any]) -> bytes:
    """Columns ``text`` (string) and ``vector`` (fixed_size_list<float32>[dim]), the layout vector
    databases and ``pyarrow``/``pandas``/DuckDB read as an array column."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        from taskrun.tasks.base import TaskError

        raise TaskError("-o .parquet needs pyarrow: pip install pyarrow (or write .npy, .jsonl or .csv)") from None
    m = _matrix(vectors)
    column = pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1), pa.float32()), m.shape[1])
    table = pa.table({"text": pa.array(texts, pa.string()), "vector": column})
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    return buf.getvalue().to_pybytes()
