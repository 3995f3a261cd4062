"""The FastAPI app of `run serve`: ``create_app(settings)``.

Every error leaves in OpenAI's ``{"error": {...}}`` shape with a 4xx, whatever raised it (a bad
body, an unknown route, a TaskError from a job); an unexpected exception is logged with its
traceback on the server's stderr and answered 500 "internal error (see the server log)", so no
traceback ever reaches a client. The OpenAPI document is served at /openapi.json, behind the API
key when one is set (the Guard covers every path but /health); no interactive /docs page is
served (it loads scripts from a CDN, and these servers are offline). docs/serve.md documents the
endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from taskrun.runner.serve.security import Guard, Origins
from taskrun.runner.serve.service import InternalError, Service
from taskrun.runner.serve.settings import Settings
from taskrun.tasks.base import TaskError
from taskrun.tasks.wire.errors import APIError, from_task_error, public

log = logging.getLogger("taskrun.serve")


async def _sweep_while_serving() -> None:
    """Sweep upload folders of dead processes every TASKRUN_SWEEP_S seconds (default 600) while the
    server runs, not only at its start: a long-lived server beside others that get killed (the OOM
    killer, kill -9 of a sibling) would otherwise keep their uploads in the temp folder for ever."""
    from taskrun.runner.serve.sweep import sweep_uploads

    every = float(os.environ.get("TASKRUN_SWEEP_S", "600") or 600)
    while every > 0:
        await asyncio.sleep(every)
        try:
            gone = await asyncio.to_thread(sweep_uploads)
        except Exception:  # a sweep that fails must not stop the server; the next one tries again
            log.exception("sweeping upload folders failed")
            continue
        if gone:
            log.info("swept %d upload folder(s) of processes no longer running", len(gone))


def create_app(settings: Settings) -> FastAPI:
    from taskrun.runner.serve import routes_native, routes_ollama, routes_ollama_info, routes_openai, routes_responses
    from taskrun.runner.serve.batching import EmbedBatcher

    service = Service(settings)
    if settings.batching:
        service.batcher = EmbedBatcher(service, settings.batch_window_s, settings.batch_max_texts)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.ensure_future(_preload(service, m)) for m in settings.preload]
        tasks.append(asyncio.ensure_future(_sweep_while_serving()))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            service.workers.close()

    app = FastAPI(title="taskrun", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.service = service
    _install_error_handlers(app)
    _install_ops(app, service)
    routes_openai.register(app, service)
    routes_responses.register(app, service)
    routes_ollama.register(app, service)
    routes_ollama_info.register(app, service)
    routes_native.register(app, service)
    origins = Origins(settings.host, settings.allowed_origins)
    app.add_middleware(
        Guard,
        api_key=settings.api_key,
        max_body=settings.max_body_bytes,
        origins=origins,
        more_keys=settings.more_keys,
    )
    app.add_middleware(_Counted, metrics=service.metrics)
    return app


def _error(
    err: APIError, headers: dict | None = None, request: Request | None = None, corpora: dict | None = None
) -> JSONResponse:
    """The error body, without server paths or flags: OpenAI's shape, or Ollama's ``{"error": "..."}`` on /api/*."""
    err = public(err, corpora)
    run_id = getattr(err, "run_id", None)
    headers = {**(headers or {}), **({"X-Taskrun-Run-Id": run_id} if run_id else {})}
    ollama = request is not None and request.url.path.startswith("/api/")
    body = {"error": err.message} if ollama else err.body()
    return JSONResponse(body, status_code=err.status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    corpora = app.state.service.settings.corpora

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        retry = getattr(exc, "retry_after", None)
        return _error(exc, {"Retry-After": str(retry)} if retry else None, request, corpora)

    @app.exception_handler(TaskError)
    async def task_error(request: Request, exc: TaskError):
        return _error(from_task_error(exc), request=request, corpora=corpora)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        message = f"{where or 'request'}: {first.get('msg', 'invalid request')}"
        return _error(APIError(400, message, param=where), request=request)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        message = {
            404: f"no endpoint {request.method} {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error(APIError(exc.status_code, message, type=kind), dict(exc.headers or {}), request)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, exc: ClientDisconnect):
        if not request.scope.get("taskrun.cut"):  # a stalled one cut by runner/serve/connections.py is counted there
            log.info("client left during %s %s before its request was read", request.method, request.url.path)
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception):
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error(InternalError(), request=request)


def _install_ops(app: FastAPI, service: Service) -> None:
    @app.get("/health")
    async def health():
        states = service.preload_state
        failed = {m: s for m, s in states.items() if s not in ("loading", "ready")}
        if failed:
            return JSONResponse({"status": "error", "models": states}, status_code=503)
        if any(s == "loading" for s in states.values()):
            return JSONResponse({"status": "loading", "models": states}, status_code=503)
        return {"status": "ok", "models": states}

    @app.get("/metrics")
    async def metrics(request: Request):
        body, content_type = service.metrics.exposition(
            service.workers.depth(), request.headers.get("accept", ""), service.workers.batches()
        )
        return Response(body, headers={"Content-Type": content_type})


async def _preload(service: Service, model: str) -> None:
    """Load ``model`` on its own worker thread, so /health says ready only once it is warm."""

    def load():
        from taskrun.pipelines import load_pipeline

        card = service.catalogue.card(model)
        if not card.tasks:
            raise TaskError(f"{model} serves no task taskrun knows; it cannot be preloaded")
        with service.loads.loading((model, card.tasks[0], None)):
            load_pipeline(card.tasks[0], card, card.runtime, service.settings.device, service.settings.dtype)

    try:
        # resolved off the event loop (a first resolve may hash the weights): the worker is the
        # weights', so the card is needed to find it
        await asyncio.to_thread(service.catalogue.card, model)
    except TaskError:
        pass  # the load below reports it
    worker = service.workers.get(model)
    try:
        worker.admit()
        await worker.run(load)
        service.preload_state[model] = "ready"
        log.info("preloaded %s", model)
    except Exception as exc:  # the operator sees why on stderr and in /health
        message = exc.message if isinstance(exc, APIError) else str(exc) or type(exc).__name__
        service.preload_state[model] = f"failed: {message}"
        log.error("could not preload %s: %s", model, message, exc_info=not isinstance(exc, (TaskError, APIError)))


class _Counted:
    """Counts every answer by route and status (the route's template, so ids do not explode
    the label set)."""

    def __init__(self, app, metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            self.metrics.request(getattr(route, "path", "unmatched"), status[0])
