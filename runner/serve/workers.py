"""Jobs off the event loop: one worker thread per model, each with a bounded queue.

The engines are not thread-safe (an LLM engine holds one KV state), so the jobs of one model run
one after another on that model's thread; different models run side by side. A model's queue is
bounded (``--max-queue``): a request that finds it full is answered 503 with ``Retry-After``
at once, instead of the server's memory growing without end. The time a job waits before its
thread takes it is measured (``queue_wait_s``).

A job whose client has gone is stopped: ``on_event``, called by the pipeline for every token,
segment or step, raises :class:`ClientGone` once the cancel flag is set, which ends the
pipeline's generator; run_job logs the job as failed with "cancelled by the client". A job that
is cancelled before its turn never starts, and is logged as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskrun.runner.jobs import run_spec
from taskrun.tasks import cache_scope, seq_batch
from taskrun.tasks.base import TaskError
from taskrun.tasks.wire.errors import APIError
from taskrun.tasks.wire.jobspec import JobSpec

CANCELLED = "cancelled by the client"
AUTO_PARALLEL = (
    4  # batch threads per model when --parallel is 0 (llamacpp_batch.AUTO_MAX, not imported: torch-free start)
)
STOPPING = threading.Event()  # set on SIGTERM/SIGINT: running jobs end as "interrupted by SIGTERM"


def stopping_error() -> APIError:
    return APIError(
        503,
        "the server is shutting down, so this job was interrupted; send it again once it is back",
        type="server_error",
        code="server_shutting_down",
    )


class ClientGone(TaskError):
    """Raised inside a job whose client disconnected: a TaskError, so run_job logs its message
    ("cancelled by the client") as the job's error, as it does for any job that cannot finish."""


class QueueFull(APIError):
    def __init__(self, model: str, limit: int, retry_after: int) -> None:
        super().__init__(
            503,
            f"the queue for {model} is full ({limit} waiting); retry in a few seconds",
            type="server_error",
            code="queue_full",
        )
        self.retry_after = retry_after


class CapturingLog:
    """The run log, remembering the id of the row it appended: a job that fails raises before
    run_job returns its record, and the client still gets the run id."""

    def __init__(self, log) -> None:
        self.log, self.run_id = log, None

    def append(self, row: dict) -> None:
        self.run_id = row.get("id")
        self.log.append(row)


class ServerJob:
    """One job's thread side: runs the spec, forwards its events to the event loop, obeys cancel."""

    def __init__(
        self,
        spec: JobSpec,
        log,
        loop: asyncio.AbstractEventLoop,
        forward: Callable[[Any], None] | None,
        device: str,
        dtype: str,
        loads: LoadGate | None = None,
        cache_scope: str | None = "local",
        join: seq_batch.Join | None = None,
    ) -> None:
        self.spec, self.loop, self.forward, self.loads = spec, loop, forward, loads
        self.cache_scope = cache_scope  # whose cached prompt prefixes it may reuse (tasks/cache_scope.py)
        self.join = join  # the model's batch this job's answer decodes in (tasks/seq_batch.py), or None
        self.arrival: seq_batch.Arrival | None = None  # set once admitted: it is on its way to the batch
        self.log = CapturingLog(log)
        self.device, self.dtype = device, dtype
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self.queue_wait_s: float | None = None  # set when its thread takes it
        self._gate: tuple | None = None  # the load gate's key while this job holds it

    @property
    def run_id(self) -> str | None:
        return self.log.run_id

    def cancel(self) -> None:
        self.cancelled.set()

    def on_event(self, event: Any) -> None:
        self._open_gate(loaded=True)  # an event: the model is loaded
        if STOPPING.is_set():
            from taskrun.runner.signals import Terminated

            raise Terminated()  # run_job logs the row "interrupted by SIGTERM"; execute() answers 503
        if self.cancelled.is_set():
            raise ClientGone(CANCELLED)
        if self.forward is not None:
            self.loop.call_soon_threadsafe(self.forward, event)

    def execute(self):
        """Run to the end (in the model's thread) → JobRecord; raises as run_job does."""
        self.queue_wait_s = time.perf_counter() - self.submitted
        if STOPPING.is_set():
            raise stopping_error()
        if self.cancelled.is_set():
            self._log_never_started()
            raise ClientGone(CANCELLED)
        key = (self.spec.model, self.spec.task, self.spec.runtime)
        self._gate = key if self.loads is not None and self.loads.enter(key) else None
        scoped = cache_scope.SCOPE.set(self.cache_scope)  # this thread runs this job alone until it ends
        joined = seq_batch.JOIN.set(self.join)
        arriving = seq_batch.ARRIVAL.set(self.arrival)
        try:
            return run_spec(
                self.spec, log=self.log, on_event=self.on_event, device=self.device, dtype=self.dtype, offline=True
            )  # a client never makes the server download
        except KeyboardInterrupt:  # never into the event loop: asyncio would re-raise it there
            raise stopping_error() from None
        finally:
            if self.arrival is not None:  # it ended before its engine took a slot
                self.arrival.landed()
            seq_batch.ARRIVAL.reset(arriving)
            seq_batch.JOIN.reset(joined)
            cache_scope.SCOPE.reset(scoped)
            self._open_gate(loaded=False)  # still held: it ended before any event; the next one loads

    def _open_gate(self, loaded: bool) -> None:
        if self._gate is not None:
            key, self._gate = self._gate, None
            self.loads.leave(key, loaded)

    def _log_never_started(self) -> None:
        from datetime import datetime, timezone

        from taskrun.runner.jobs import new_id

        self.log.append(
            {
                "id": new_id(),
                "task": self.spec.task,
                "model": self.spec.model,
                "status": "failed",
                "error": CANCELLED + " before the job started",
                "started_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            }
        )


class LoadGate:
    """One model loads at a time in this process: transformers and diffusers switch process-wide
    state while they build a model (weight initialisation off, the meta device), so two loads in
    two threads break each other ("Cannot copy out of meta tensor"). The first job of each
    (model, task, runtime) holds the gate until its first event (its model is loaded by then) or
    its end; warm ones never wait for it, so jobs of different models still run side by side.
    The load's time stays in that job's own load_s. The model cache serialises the loads that go
    through it too (taskrun.pipelines._LOAD_LOCK); this gate also covers whatever a first job
    builds outside that cache while it sets up."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.warm: set[tuple] = set()

    def enter(self, key: tuple) -> bool:
        """Wait for the gate when ``key`` may still have to load; True if it was taken."""
        if key in self.warm:
            return False
        self.lock.acquire()
        return True

    def leave(self, key: tuple, loaded: bool) -> None:
        if loaded:
            self.warm.add(key)
        self.lock.release()

    @contextlib.contextmanager
    def loading(self, key: tuple):
        """Around a load outside a job (--preload)."""
        taken = self.enter(key)
        try:
            yield
        except BaseException:
            if taken:
                self.leave(key, False)
            raise
        if taken:
            self.leave(key, True)


class ModelWorker:
    """The thread and the queue of one model; and the threads of its batch (``join``): jobs that
    decode as sequences of one llama.cpp batch (tasks/seq_batch.py) run side by side, one thread
    each, up to the batch's bound, since they share no state but the engine's batch, which is
    made for them (pipelines/llm/llamacpp_batch.py)."""

    def __init__(self, model: str, max_queue: int, parallel: int = 1) -> None:
        self.model, self.max_queue = model, max_queue
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"taskrun-{model}"[:40])
        threads = parallel or AUTO_PARALLEL
        self.join = seq_batch.Join(parallel) if threads > 1 else None
        self.batch_pool = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"taskrun-b-{model}"[:40])
            if self.join is not None
            else None
        )
        self.waiting = 0  # submitted, not started (event loop thread only)
        self.running = 0
        self.recent_s = 1.0  # how long a recent job took, to suggest when to retry

    def admit(self) -> None:
        """Take a place in the queue, or raise QueueFull when ``max_queue`` jobs already wait.
        Synchronous, so two requests arriving together cannot both take the last place."""
        if self.waiting >= self.max_queue:
            raise QueueFull(self.model, self.max_queue, max(1, round(self.recent_s * (self.waiting + 1))))
        self.waiting += 1

    async def run(self, fn: Callable[[], Any], batched: bool = False) -> Any:
        """``fn()`` on this model's thread (on one of its batch's, ``batched``), for a job that
        was admitted (it holds a place)."""
        started = asyncio.get_running_loop().create_future()

        def call():
            started.get_loop().call_soon_threadsafe(_set_once, started)
            t0 = time.perf_counter()
            try:
                return fn()
            finally:
                self.recent_s = 0.8 * self.recent_s + 0.2 * (time.perf_counter() - t0)

        pool = self.batch_pool if batched and self.batch_pool is not None else self.pool
        future = asyncio.get_running_loop().run_in_executor(pool, call)
        try:
            await asyncio.wait([started, future], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            return await asyncio.shield(future)
        finally:
            self.running -= 1

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.batch_pool is not None:
            self.batch_pool.shutdown(wait=False, cancel_futures=True)


def _set_once(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Workers:
    """Every model's worker, made on first use. ``same_as`` maps a model's name to what it loads
    (its weights' digest): two names for one file (an alias and its path) get one worker, since
    they get one loaded engine, whose state (a KV cache) a second thread would corrupt."""

    def __init__(self, max_queue: int, same_as: Callable[[str], str] | None = None, parallel: int = 1) -> None:
        self.max_queue, self.parallel = max_queue, parallel
        self.same_as = same_as or (lambda model: model)
        self.by_model: dict[str, ModelWorker] = {}
        self._by_weights: dict[str, ModelWorker] = {}

    def get(self, model: str) -> ModelWorker:
        if model not in self.by_model:
            weights = self.same_as(model)
            if weights not in self._by_weights:
                self._by_weights[weights] = ModelWorker(model, self.max_queue, self.parallel)
            self.by_model[model] = self._by_weights[weights]
        return self.by_model[model]

    def depth(self) -> dict[str, int]:
        return {m: w.waiting + w.running for m, w in self.by_model.items()}

    def batches(self) -> dict[str, tuple[int, int, int]]:
        """(running sequences, waiting requests, sequences in the last step) of each model's batch
        that exists: requests waiting for the model's batch threads count as waiting too."""
        out = {}
        for w in self._by_weights.values():
            j = w.join
            if j is not None and j.slots:
                with j.lock:
                    out[w.model] = (j.running, j.waiting + w.waiting, j.batch_size)
        return out

    def close(self) -> None:
        for w in self._by_weights.values():
            w.close()
