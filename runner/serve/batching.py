"""Dynamic batching of embeddings, as text-embeddings-inference does it.

Concurrent embeddings requests for one model (and the same options) are merged into ONE embed
job: one forward pass over all their texts instead of one per request, which on a CPU is most of
the cost of a short text. A batch opens with the first request, waits ``window_s`` for company,
then joins its model's queue, and keeps taking requests until the model's thread starts it (so
under load, everything that arrived while the previous batch ran goes in the next one), up to
``max_texts`` texts. Each request gets its own slice of the results back; the merged job is one
row of the run log, and every request's ``X-Taskrun-Run-Id`` names that row.

A client that leaves takes its request out of the count: once every client of a batch has gone,
its job is cancelled, as a lone job is (it stops after its current forward pass, or never starts),
and its row says "cancelled by the client"; while one is left, the job runs for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

from taskrun.runner.serve.service import InternalError, log, watch_client
from taskrun.runner.serve.workers import ClientGone, ServerJob
from taskrun.tasks.base import TaskError
from taskrun.tasks.wire.errors import APIError, from_task_error
from taskrun.tasks.wire.jobspec import JobSpec


class _Batch:
    """Requests waiting to run as one job; closed (under its lock) when the job starts."""

    def __init__(self, model: str, spec: JobSpec, max_texts: int) -> None:
        self.model, self.runtime, self.options = model, spec.runtime, dict(spec.options)
        self.max_texts = max_texts
        self.parts: list[tuple[JobSpec, asyncio.Future]] = []
        self.texts = 0
        self.closed = False
        self.lock = threading.Lock()
        self.launched_at = 0.0
        self.gone: set[int] = set()  # the parts (by index) whose clients left
        self.job: ServerJob | None = None  # once its model's thread has made it

    def add(self, spec: JobSpec) -> asyncio.Future | None:
        """A future for this request's (record, offset, count); None if the batch is closed or full."""
        with self.lock:
            if self.closed or self.texts and self.texts + len(spec.inputs) > self.max_texts:
                return None
            future = asyncio.get_running_loop().create_future()
            self.parts.append((spec, future))
            self.texts += len(spec.inputs)
            return future

    def close(self) -> list[tuple[JobSpec, asyncio.Future]]:
        with self.lock:
            self.closed = True
            return list(self.parts)

    def start(self, job: ServerJob) -> None:
        """``job`` runs this (closed) batch: cancelled already if every client has left."""
        with self.lock:
            self.job = job
            if self._abandoned():
                job.cancel()

    def leave(self, future: asyncio.Future) -> None:
        """The client of ``future``'s request left: when it was the last, the job is cancelled.
        A batch still open keeps the count: a request that joins it later runs it again."""
        with self.lock:
            self.gone.update(i for i, (_, f) in enumerate(self.parts) if f is future)
            if self.job is not None and self._abandoned():
                self.job.cancel()

    def _abandoned(self) -> bool:
        return len(self.gone) == len(self.parts)


class EmbedBatcher:
    def __init__(self, service, window_s: float = 0.005, max_texts: int = 256) -> None:
        self.service, self.window_s, self.max_texts = service, window_s, max_texts
        self.open: dict[tuple, _Batch] = {}
        self.running: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    async def run(self, spec: JobSpec, request=None):
        """This request's embeddings → (JobRecord with only its items, run id). With ``request``,
        a client that disconnects leaves the batch (the last one to leave cancels its job)."""
        spec.model = await self.service.model_for(spec)
        key = (spec.model, spec.runtime, json.dumps(spec.options, sort_keys=True))
        batch = self.open.get(key)
        future = batch.add(spec) if batch is not None else None
        if future is None:
            batch = self.open[key] = _Batch(spec.model, spec, self.max_texts)
            future = batch.add(spec)
            asyncio.get_running_loop().call_later(self.window_s, self._launch, key, batch)
        watcher = asyncio.ensure_future(watch_client(request, lambda: batch.leave(future))) if request else None
        try:
            rec, offset, count = await future
        finally:
            if watcher is not None:
                watcher.cancel()
        return record_slice(rec, offset, count), rec.id

    def _launch(self, key: tuple, batch: _Batch) -> None:
        worker = self.service.workers.get(batch.model)
        batch.launched_at = time.perf_counter()
        try:
            worker.admit()
        except APIError as exc:
            self._forget(key, batch)
            for _, future in batch.close():
                future.set_exception(exc)
            return
        task = asyncio.ensure_future(self._run(key, batch, worker))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(self, key: tuple, batch: _Batch, worker) -> None:
        loop = asyncio.get_running_loop()
        state: dict = {}

        def execute():
            parts = batch.close()
            loop.call_soon_threadsafe(self._forget, key, batch)
            state["parts"] = parts
            merged = JobSpec(
                "embed",
                [inp for spec, _ in parts for inp in spec.inputs],
                batch.options,
                model=batch.model,
                runtime=batch.runtime,
            )
            job = state["job"] = ServerJob(
                merged,
                self.service.log,
                loop,
                None,
                self.service.settings.device,
                self.service.settings.dtype,
                self.service.loads,
            )
            job.submitted = batch.launched_at
            batch.start(job)
            return job.execute()

        try:
            rec = await worker.run(execute)
        except Exception as exc:
            self._fail(batch, state, exc)
            return
        self.service.metrics.batch_size.labels(batch.model).observe(len(state["parts"]))
        self.service.metrics.job("embed", batch.model, rec.status, state["job"].queue_wait_s, rec)
        offset = 0
        for spec, future in state["parts"]:
            if not future.done():
                future.set_result((rec, offset, len(spec.inputs)))
            offset += len(spec.inputs)

    def _fail(self, batch: _Batch, state: dict, exc: Exception) -> None:
        job = state.get("job")
        if job is not None:
            status = "cancelled" if isinstance(exc, ClientGone) else "failed"
            self.service.metrics.job("embed", job.spec.model, status, job.queue_wait_s)
        if isinstance(exc, TaskError):
            err: Exception = from_task_error(exc)
        elif isinstance(exc, APIError):
            err = exc
        else:
            log.error("embeddings batch failed", exc_info=exc)
            err = InternalError()
        if isinstance(err, APIError):
            err.run_id = job.run_id if job is not None else None
        for _, future in state.get("parts") or batch.close():
            if not future.done():
                future.set_exception(err)

    def _forget(self, key: tuple, batch: _Batch) -> None:
        if self.open.get(key) is batch:
            del self.open[key]


def record_slice(rec, offset: int, count: int):
    """The record as one request of a merged job sees it: its own items and errors, indexed from 0."""

    def mine(index: int) -> bool:
        return offset <= index < offset + count

    items = [dataclasses.replace(it, index=it.index - offset) for it in rec.items if mine(it.index)]
    errors = [dataclasses.replace(e, index=e.index - offset) for e in rec.errors if mine(e.index)]
    status = "ok" if not errors else "partial" if items else "failed"
    return dataclasses.replace(rec, items=items, errors=errors, n_inputs=count, status=status)
