"""One clock for every task, so that every ``*_s`` metric means the same thing.

``Clock`` starts when the job starts. ``scope(name)`` adds the time spent inside a ``with``
block to a named total; ``now()`` is the time since the job started (the first token's
``ttft_s`` is read from it).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.totals: dict[str, float] = {}

    def now(self) -> float:
        """Seconds since the job started."""
        return time.perf_counter() - self.t0

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds

    def total(self, name: str) -> float:
        return self.totals.get(name, 0.0)
