"""One clock for every task, so that every ``*_s`` metric means the same thing.

``Clock`` starts when the job starts. ``scope(name)`` adds the time spent inside a ``with``
block to a named total; ``now()`` is the time since the job started (the first token's
``ttft_s`` is read from it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


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


def timed(gen, add: Callable[[float], Any]) -> Iterator[Any]:
    """Yield what ``gen`` yields, passing ``add`` the seconds spent inside ``gen`` only: the time
    the consumer holds each item (printing it, drawing a bar) is not the pipeline's work."""
    it = iter(gen)
    while True:
        t = time.perf_counter()
        try:
            item = next(it)
        except StopIteration as stop:
            add(time.perf_counter() - t)
            return stop.value
        add(time.perf_counter() - t)
        yield item
