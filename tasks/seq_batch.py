"""Whether a job's answer may share one running batch with other jobs' (continuous batching).

Why: decoding one token streams every weight once; several sequences decoded in one forward pass
share that stream, so concurrent clients of `run serve` cost little more than one (issue 32,
item 3). The server sets ``JOIN`` around a generate job on a llama.cpp model; the llama.cpp engine
(pipelines/llm/llamacpp_batch.py) then decodes that job's answer as one sequence of the model's
batch context instead of in its own context. Outside the server (or with ``--parallel 1``) it is
None and every answer is decoded alone, as before.

A context variable, like tasks/cache_scope.py, so that the engines read it without importing the
server; torch-free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar


class Join:
    """One model's batch as the server sees it: the bound it asked for and what the engine reports.

    ``parallel`` is the most sequences decoded together (0: chosen from memory by the engine);
    ``running``, ``waiting`` and ``batch_size`` are kept by the engine under ``lock`` and read by
    /metrics. ``on_step(n)`` (when set) is called after each decode step of ``n`` sequences,
    ``on_prompts(n)`` after each llama_decode that read (part of) ``n`` prompts."""

    def __init__(self, parallel: int = 0, on_step: Callable[[int], None] | None = None) -> None:
        self.parallel, self.on_step = parallel, on_step
        self.on_prompts: Callable[[int], None] | None = None
        self.lock = threading.Lock()
        self.slots = 0  # sequences the engine made room for (0 until the model's batch exists)
        self.running = 0  # sequences holding a slot (prefill or decode)
        self.waiting = 0  # jobs waiting for a free slot
        self.batch_size = 0  # sequences in the last decode step
        self.max_batch_size = 0  # the most sequences one decode step has held
        self.coming = 0  # jobs the server took for this batch that have not reached the engine yet

    def expect(self) -> Arrival:
        """One more job on its way to this batch (the server took its request) → its Arrival."""
        with self.lock:
            self.coming += 1
        return Arrival(self)


class Arrival:
    """One job between the server taking its request and its engine taking a slot (or the job
    ending first). While it is on its way, a step that would read a prompt waits a little for its
    prompt too (pipelines/llm/llamacpp_batch.py, ARRIVE_S): prompts read in one pass cost less
    than read one a pass. ``landed()`` says it is no longer coming; a second call does nothing."""

    def __init__(self, join: Join) -> None:
        self.join, self.pending = join, True

    def landed(self) -> None:
        with self.join.lock:
            if self.pending:
                self.pending = False
                self.join.coming -= 1


JOIN: ContextVar[Join | None] = ContextVar("taskrun_seq_batch", default=None)
ARRIVAL: ContextVar[Arrival | None] = ContextVar("taskrun_seq_arrival", default=None)


def current() -> Join | None:
    """The running job's batch, or None: decode alone."""
    return JOIN.get()


def landed() -> None:
    """The running job reached its batch's engine: no longer counted as coming."""
    arrival = ARRIVAL.get()
    if arrival is not None:
        arrival.landed()
