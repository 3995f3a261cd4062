"""The server's state and the one path every endpoint runs a job through.

``Service.start`` checks the model (404 for one this server does not have), puts the job on
that model's worker (503 when its queue is full), forwards the job's events to an asyncio queue
when the endpoint streams, and watches the client: a client that goes away cancels its job.
``Running.result`` is the finished JobRecord, or an APIError carrying the run id; metrics are
recorded here, once per job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from taskrun.runner.serve.catalogue import Catalogue
from taskrun.runner.serve.metrics import ServerMetrics
from taskrun.runner.serve.security import tenant_of
from taskrun.runner.serve.settings import Settings
from taskrun.runner.serve.workers import ClientGone, LoadGate, ServerJob, Workers
from taskrun.tasks import cache_scope
from taskrun.tasks.base import TaskError
from taskrun.tasks.wire.errors import APIError, from_task_error, public
from taskrun.tasks.wire.jobspec import JobSpec

log = logging.getLogger("taskrun.serve")
_END = object()
DISCONNECT_POLL_S = 0.05


class InternalError(APIError):
    """A failure that is not the client's: its traceback goes to the server log, never to the client."""

    def __init__(self) -> None:
        super().__init__(500, "internal error (see the server log)", type="server_error")


class Running:
    """A job on its way: its events (when streamed) and its record."""

    def __init__(
        self, service: Service, job: ServerJob, model: str, future: asyncio.Future, events: asyncio.Queue | None
    ) -> None:
        self.service, self.job, self.model, self.future, self.queue = service, job, model, future, events
        # A stream closed early never asks for the outcome: mark it seen (it is in the run log).
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        if events is not None:
            future.add_done_callback(lambda _: events.put_nowait(_END))

    @property
    def run_id(self) -> str | None:
        return self.job.run_id

    async def events(self) -> AsyncIterator[Any]:
        """The job's events as they happen, until it ends (then ``result()`` says how)."""
        assert self.queue is not None, "start(..., stream=True) to receive events"
        while True:
            event = await self.queue.get()
            if event is _END:
                return
            yield event

    async def result(self):
        """The JobRecord; APIError (with ``run_id`` set) for a job that failed."""
        try:
            return await asyncio.shield(self.future)
        except APIError as exc:
            exc.run_id = self.run_id
            public(exc, self.service.settings.corpora)  # in place: a stream's error line reads it too
            raise
        except TaskError as exc:
            err = public(from_task_error(exc), self.service.settings.corpora)
            err.run_id = self.run_id
            raise err from None

    def cancel(self) -> None:
        self.job.cancel()


class Service:
    """What one app holds: its settings, metrics, model workers, catalogue, run log and batcher."""

    def __init__(self, settings: Settings) -> None:
        from taskrun.runner.runlog.store import RunLog

        self.settings = settings
        self.metrics = ServerMetrics()
        self.catalogue = Catalogue(settings.preload)
        self.workers = Workers(settings.max_queue, same_as=self._weights_of, parallel=settings.parallel)
        self.log = RunLog(settings.log_db)
        self.preload_state: dict[str, str] = {m: "loading" for m in settings.preload}
        self.batcher = None  # an EmbedBatcher when batching is on (app.py sets it)
        self.loads = LoadGate()

    def _weights_of(self, model: str) -> str:
        """What ``model`` loads (its card is resolved already: model_for or the preload did)."""
        try:
            card = self.catalogue.card(model)
        except TaskError:
            return model
        return card.digest or str(card.path)

    async def model_for(self, spec: JobSpec) -> str:
        kind = spec.inputs[0].kind if spec.inputs else None
        return await asyncio.to_thread(self.catalogue.model_for, spec.task, spec.model, kind)

    async def start(self, spec: JobSpec, request=None, *, stream: bool = False) -> Running:
        """Queue ``spec`` on its model's worker; with ``request``, a client that disconnects
        cancels it. Raises APIError (404, 400, 503) before anything runs."""
        model = await self.model_for(spec)
        spec.model = model
        if spec.runtime and not self.settings.client_runtimes:
            self._check_runtime(spec)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue | None = asyncio.Queue() if stream else None
        worker = self.workers.get(model)
        batched = worker.join is not None and self._batched(spec, model)
        job = ServerJob(
            spec,
            self.log,
            loop,
            queue.put_nowait if queue is not None else None,
            self.settings.device,
            self.settings.dtype,
            self.loads,
            cache_scope.for_tenant(self.settings.prompt_cache, tenant_of(request.scope) if request is not None else ""),
            worker.join if batched else None,
        )
        worker.admit()  # 503 when the queue is full
        if batched and worker.join is not None:
            job.arrival = worker.join.expect()  # a step about to read a prompt waits a little for its prompt
        if batched and worker.join is not None and worker.join.on_step is None:
            worker.join.on_step = self.metrics.batch_steps.labels(worker.model).observe
            worker.join.on_prompts = self.metrics.batch_prompts.labels(worker.model).observe
        future = asyncio.ensure_future(self._execute(worker, job, model, batched))
        if request is not None:
            watcher = asyncio.ensure_future(watch_client(request, job.cancel))
            future.add_done_callback(lambda _: watcher.cancel())
        return Running(self, job, model, future, queue)

    def _batched(self, spec: JobSpec, model: str) -> bool:
        """Whether ``spec`` may decode in its model's batch: a generate job on llama.cpp."""
        if spec.task != "generate":
            return False
        try:
            return (spec.runtime or self.catalogue.card(model).runtime) == "llama.cpp"
        except (TaskError, APIError):
            return False

    def _check_runtime(self, spec: JobSpec) -> None:
        """Runtimes are the operator's choice: a client naming another one than the model's (a
        conversion and its memory on the server: transformers for a GGUF) is refused unless the
        server was started with --client-runtimes."""
        from taskrun.tasks.wire.errors import invalid

        try:
            card = self.catalogue.card(spec.model)
        except TaskError:
            return  # an unknown model is refused where it is looked up
        if spec.runtime != card.runtime:
            raise invalid(
                "runtime",
                f'"runtime": {spec.runtime!r} is not this server\'s choice for {card.name} (it runs '
                f"{card.runtime}); leave the field out, or ask the operator to start the server with "
                f"--client-runtimes",
            )

    async def _execute(self, worker, job: ServerJob, model: str, batched: bool = False):
        task = job.spec.task
        try:
            rec = await worker.run(job.execute, batched)
        except ClientGone:  # its row says "cancelled by the client"
            self.metrics.job(task, model, "cancelled", job.queue_wait_s)
            raise
        except TaskError:
            self.metrics.job(task, model, "failed", job.queue_wait_s)
            raise
        except APIError:  # the server stopping under it (workers.stopping_error): its row says interrupted
            self.metrics.job(task, model, "interrupted", job.queue_wait_s)
            raise
        except Exception:
            log.exception("job %s (%s on %s) failed", job.run_id, task, model)
            self.metrics.job(task, model, "failed", job.queue_wait_s)
            raise InternalError() from None
        finally:
            if job.arrival is not None:  # it may never have run (cancelled in the queue, the server stopping)
                job.arrival.landed()
        self.metrics.job(task, model, rec.status, job.queue_wait_s, rec)
        return rec

    async def run(self, spec: JobSpec, request=None):
        """Run ``spec`` to the end → JobRecord (APIError for a job that failed)."""
        running = await self.start(spec, request)
        return await running.result()


async def watch_client(request, gone: Callable[[], None]) -> None:
    """Call ``gone()`` once the client of ``request`` disconnects (a job's cancel; a merged
    embeddings batch's leave, runner/serve/batching.py). Cancel the task to stop watching."""
    while True:
        await asyncio.sleep(DISCONNECT_POLL_S)
        if await request.is_disconnected():
            gone()
            return
