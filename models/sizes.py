"""Byte sizes as people write them ("4GB", "512MiB", "1.5g") and back. Torch-free."""

from __future__ import annotations

import re

from taskrun.tasks.base import TaskError

# Decimal units (KB, MB, GB, TB) are powers of 1000, as disk and RAM vendors and `ls -h --si`
# use them; binary ones (KiB…) and the bare letters (k, m, g, t, as docker --memory and ulimit
# take them) are powers of 1024.
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(text: str | int, what: str = "size") -> int:
    """Bytes from ``4GB`` (10⁹), ``4GiB`` or ``4g`` (2³⁰), ``512MB``, ``1.5TB`` or a plain byte count.

    ``what`` names the setting in the error (e.g. "--max-memory")."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _SIZE.fullmatch(str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise TaskError(f"{what} takes a size such as 4GB, 512MB or 8GiB (got {text!r})")
        value, unit = float(m.group(1)), m.group(2).lower()
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise TaskError(f"{what} must be more than 0 bytes (got {text!r})")
    return n


def format_size(n: int | float) -> str:
    """A byte count for people: 1.2 GB, 87.3 MB, 512 B (decimal units, as parse_size reads them)."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
