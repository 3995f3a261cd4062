"""A job's events as an iterator: the job runs in a thread of its own and hands each event over a
queue, so a caller reads tokens, transcript segments and image steps as the CLI prints them.

The consumer never waits on a dead thread: the thread always sends its end (the record or the
exception), and a wait that outlives the thread is an error. A caller that stops reading (``break``,
``close()``) stops the job at its next event, which is logged as a CLI job whose reader closed
the pipe is.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from taskrun.runner.jobs import JobRecord

_END = object()


class Stream:
    """Iterate it for the job's events (``taskrun.tasks.events``: ``Token``, ``Partial`` (a
    transcript segment), ``Step``, ``Progress``, ``Notice``, ``Item``, ``ItemError``, ``Done``);
    once it is exhausted, ``result`` is what ``taskrun.run`` would have returned."""

    def __init__(self, start: Callable[[Callable[[Any], None]], JobRecord], finish: Callable[[JobRecord], Any]):
        self._start, self._finish = start, finish
        self._stop = threading.Event()
        self._events: Iterator[Any] | None = None
        self._done = False
        self._result: Any = None

    def __iter__(self) -> Iterator[Any]:
        if self._events is None:
            self._events = self._run()
        return self._events

    def __next__(self) -> Any:
        return next(iter(self))

    @property
    def result(self) -> Any:
        """The call's result (the task's typed result, or Results), once every event was read."""
        if not self._done:
            for _ in self:
                pass
        return self._result

    def close(self) -> None:
        """Stop the job (at its next event) and wait for its run-log row."""
        if self._events is not None:
            self._events.close()  # type: ignore[attr-defined]
        self._stop.set()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> Iterator[Any]:
        q: queue.Queue = queue.Queue()

        def on_event(event: Any) -> None:
            if self._stop.is_set():  # the reader left: the job stops as a CLI job whose pipe closed
                raise BrokenPipeError("the caller stopped reading the stream")
            q.put(event)

        def work() -> None:
            try:
                q.put((_END, self._start(on_event), None))
            except BaseException as exc:  # handed to the reader, re-raised there
                q.put((_END, None, exc))

        thread = threading.Thread(target=work, name="taskrun-stream", daemon=True)
        thread.start()
        try:
            while True:
                try:
                    item = q.get(timeout=1.0)
                except queue.Empty:
                    if not thread.is_alive() and q.empty():
                        raise RuntimeError("the job's thread ended without a result") from None
                    continue
                if isinstance(item, tuple) and len(item) == 3 and item[0] is _END:
                    _, rec, exc = item
                    if exc is not None:
                        raise exc
                    self._result = self._finish(rec)
                    self._done = True
                    return
                yield item
        finally:
            self._stop.set()
            thread.join()
