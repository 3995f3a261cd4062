"""The local engine: the input streamed in windows, each window's jobs run in this process, or in
a pool of worker processes, and every finished job's lines appended to the output at once.

Memory is bounded by the window (``WINDOW`` items planned at a time, and for batched tasks
``chunk`` items per job), not by the input: a 100,000-line file streams (only the ids of the
input are kept, to refuse duplicates and to skip what is done).

The pool: torch and CTranslate2 already use every core for one job, so a pool only pays where a
job leaves cores idle. Whisper on short clips is one such case (its decoder runs token by token):
on 2 cores with whisper-tiny.en, 2 processes of 1 thread ran 20 clips of 3 s in 15.8-16.6 s
against 18.9-22.4 s for one process of 2 threads, start-up included (1.1-1.35×; no gain while
other programs held the cores; benchmarks/bench_batch.py measures it again). So ``--workers
auto`` starts a pool, one process per core, when the batch holds transcribe items (at least
``POOL_MIN_ITEMS``), and none otherwise; ``--workers N`` asks for one.
Each pool process loads its own copy of the model.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from itertools import islice

from taskrun.runner.batch.source import Entry, task_of
from taskrun.runner.batch.work import BATCHED, Context, Finished, run_window

# Items parsed and grouped at a time. A batched task's items are sorted by length within it, so
# the larger the window the less its batches pad: measured on 2,000 mixed-length sentences, jobs
# of 256 cut from unsorted input ran 2x slower than one job of all; sorted within 1,024, 1.2x.
WINDOW = 4096
POOL_TASKS = {"transcribe"}  # tasks a pool of processes measurably speeds up on CPU
POOL_MIN_ITEMS = 4  # fewer items than this do not repay the pool's start (a model load per process)


def windows(entries: Iterable[Entry], size: int) -> Iterator[list[Entry]]:
    it = iter(entries)
    while chunk := list(islice(it, size)):
        yield chunk


def auto_workers(tasks: dict[str, int]) -> int:
    """A process per core for a batch with enough pool-friendly items; else none (1)."""
    from taskrun.pipelines.device import cpu_threads

    pooled = sum(n for t, n in tasks.items() if t in POOL_TASKS)
    cores = cpu_threads()
    return cores if cores > 1 and pooled >= POOL_MIN_ITEMS else 1


def run_local(entries: Iterable[Entry], ctx: Context, write, *, log, workers: int = 1) -> None:
    """Run every entry; ``write(finished)`` is called with each finished job's lines."""
    if workers <= 1:
        for win in windows(entries, WINDOW):
            for fin in run_window(win, ctx, log):
                write(fin)
        return
    _run_pool(entries, ctx, write, log=log, workers=workers)


def units(entries: Iterable[Entry], chunk: int) -> Iterator[list[Entry]]:
    """What one pool task runs: an item of a task run one item per job, or ``chunk`` items of a
    batched task (the worker groups them by model and options)."""
    pending: dict[str, list[Entry]] = {}
    for e in entries:
        task = task_of(e)
        if task not in BATCHED:
            yield [e]
            continue
        buf = pending.setdefault(task, [])
        buf.append(e)
        if len(buf) >= chunk:
            yield pending.pop(task)
    yield from pending.values()


def _init_worker(threads: int) -> None:
    # Before torch or CTranslate2 start their thread pools: the cores are shared by the pool.
    os.environ["TASKRUN_THREADS"] = str(threads)


def pool_window(entries: list[Entry], ctx: Context) -> tuple[list[Finished], list[dict]]:
    """A pool process's (or a Ray actor's) work: the window's finished jobs and their log rows,
    which the driver writes (one writer for the output and the run log)."""
    rows: list[dict] = []
    return list(run_window(entries, ctx, rows)), rows


POOL_TRIES = 3  # a unit whose worker process dies (kill -9, the OOM killer) runs at most this often


def _run_pool(entries: Iterable[Entry], ctx: Context, write, *, log, workers: int) -> None:
    """Run the units in a pool of processes. A worker killed mid-unit breaks the whole pool: a
    new pool is started and every unit that was in flight runs again (at most ``POOL_TRIES``
    times; then its items fail, naming why), so the batch goes on."""
    run = _PoolRun(ctx, write, log, workers)
    try:
        for unit in units(entries, ctx.chunk):
            run.submit(unit, 0)
            while len(run.inflight) >= 2 * workers:  # a bounded queue: the input is not read ahead
                run.collect(cf.wait(list(run.inflight), return_when=cf.FIRST_COMPLETED)[0])
        while run.inflight:
            run.collect(cf.wait(list(run.inflight), return_when=cf.FIRST_COMPLETED)[0])
    finally:
        run.pool.shutdown(wait=True, cancel_futures=True)


class _PoolRun:
    """One batch's units on a pool of worker processes, and a new pool for one a dead worker broke."""

    def __init__(self, ctx: Context, write, log, workers: int) -> None:
        from taskrun.pipelines.device import cpu_threads

        self.ctx, self.write, self.log, self.workers = ctx, write, log, workers
        self.threads = max(1, cpu_threads() // workers)
        self.pool = self._new()
        self.inflight: dict[cf.Future, tuple[list[Entry], int]] = {}

    def _new(self) -> cf.ProcessPoolExecutor:
        import multiprocessing

        # spawn: a forked child of a process that has started torch's threads can deadlock.
        return cf.ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.threads,),
        )

    def submit(self, unit: list[Entry], tries: int) -> None:
        try:
            self.inflight[self.pool.submit(pool_window, unit, self.ctx)] = (unit, tries)
        except BrokenProcessPool:  # a worker died since the last collect; counted as a try, so a
            self.restart([(unit, tries + 1)])  # pool that breaks at once each time ends, naming why

    def take(self, fut: cf.Future) -> bool:
        """Write a finished unit's lines → True; False where its worker died (it runs again)."""
        try:
            finished, rows = fut.result()
        except BrokenProcessPool:
            return False
        for row in rows:
            if self.log is not None:
                self.log.append(row)
        for fin in finished:
            self.write(fin)
        return True

    def collect(self, done: Iterable[cf.Future]) -> None:
        again: list[tuple[list[Entry], int]] = []
        for fut in done:
            unit, tries = self.inflight.pop(fut)
            if not self.take(fut):
                again.append((unit, tries + 1))
        if again:
            self.restart(again)

    def restart(self, again: list[tuple[list[Entry], int]]) -> None:
        """A new pool for the broken one; ``again`` and the broken pool's unfinished units run on it."""
        for fut, (unit, tries) in list(self.inflight.items()):
            del self.inflight[fut]
            if not (fut.done() and self.take(fut)):  # one that finished before the pool broke is kept
                again.append((unit, tries + 1))
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = self._new()
        for unit, tries in again:
            if tries < POOL_TRIES:
                self.submit(unit, tries)
            else:
                self.write(_killed(unit, self.ctx, tries))


def _killed(unit: list[Entry], ctx: Context, tries: int):
    """The failed lines of a unit whose worker process died every time it ran it."""
    from taskrun.runner.batch.lines import Failure
    from taskrun.runner.batch.work import Prepared, failed_lines

    why = Failure(
        f"the worker process running this item died {tries} times (killed, e.g. by the OOM killer, "
        f"or crashed); run it alone to see why, or give the batch more memory",
        500,
        "server_error",
    )
    return failed_lines([Prepared(e, failure=why) for e in unit])
