"""One clock for every task, so that every ``*_s`` metric means the same thing.

``Clock`` starts when the job starts. ``scope(name)`` adds the time spent inside a ``with``
block to a named total; ``mark(name)`` remembers the first moment something happened
(first token, first segment) relative to the job's start.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.totals: dict[str, float] = {}
        self.marks: dict[str, float] = {}

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

    def mark(self, name: str) -> float:
        """Record the first time ``name`` happens; later calls keep the first value."""
        if name not in self.marks:
            self.marks[name] = self.now()
        return self.marks[name]


class Timer:
    """A stopwatch for a pipeline's inner loops: ``t = Timer(); ...; t.lap()`` gives seconds."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt
