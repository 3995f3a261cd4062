"""OpenAI's Responses API: ``POST /v1/responses`` (and ``GET /v1/responses/{id}``) run as a chat
completion (tasks/wire/responses_api.py turns one into the other), streamed as Responses events.

The conversations are kept in this process's memory, the newest MAX_KEPT, for
``previous_response_id``; a restarted server has none.
"""

from __future__ import annotations

import uuid

from fastapi import FastAPI
from starlette.requests import Request

from taskrun.runner.serve.httpio import answer, json_body, on_close, opened, release, sse
from taskrun.tasks import events as ev
from taskrun.tasks.wire import openai_api as oa
from taskrun.tasks.wire import responses_api as ra
from taskrun.tasks.wire.errors import APIError
from taskrun.tasks.wire.jobspec import Uploads
from taskrun.tasks.wire.openai_out import CompletionChunks, model_name
from taskrun.tasks.wire.responses_out import ResponseBuilder
from taskrun.tasks.wire.tools import tool_request


def register(app: FastAPI, service) -> None:
    store = ra.ResponseStore()

    @app.post(ra.RESPONSES, openapi_extra=ra.openapi_body())
    async def responses(request: Request):
        return await create(service, store, request)

    @app.get(ra.RESPONSES + "/{response_id}")
    async def response(response_id: str):
        return store.get(response_id)


async def create(service, store: ra.ResponseStore, request: Request):
    req = ra.read_request(await json_body(request), store)
    uploads = Uploads()
    running, streaming = None, False
    try:
        spec = oa.job_from_openai(oa.CHAT, req.chat, uploads=uploads)
        spec.options["stream"] = True  # token events: a client that leaves stops the job
        running = await service.start(spec, request, stream=req.stream)
        if not req.stream:
            rec = await running.result()
            build = ResponseBuilder(req, model_name(spec, rec))
            build.run_id = rec.id
            body = build.from_chat(oa.openai_body(oa.CHAT, spec, rec, req.chat))
            if req.keep:
                store.keep(body, build.conversation())
            return answer(body, rec.id)
        events = await opened(running)
        streaming = True
    finally:
        if not streaming:
            release(uploads, running)
    build = ResponseBuilder(req, spec.model or str(req.body.get("model") or ""))
    chunks = CompletionChunks(True, build.model, True, uuid.uuid4().hex[:24], tool_request(req.chat))
    return sse(_events(running, events, chunks, build, store), on_close(running, uploads), named=True)


async def _events(running, events, chunks: CompletionChunks, build: ResponseBuilder, store: ra.ResponseStore):
    for event in build.start():
        yield event
    async for event in events:
        if isinstance(event, ev.Token):
            for chunk in chunks.piece(event.text, event.index):
                for out in build.events(chunk):
                    yield out
    try:
        rec = await running.result()
    except APIError as exc:
        yield {"type": "error", **exc.body(), "run_id": getattr(exc, "run_id", None)}
        return
    for chunk in chunks.end(rec):
        for out in build.events(chunk):
            yield out
    last = build.finish()
    if build.req.keep:
        store.keep(last[-1]["response"], build.conversation())
    for out in last:
        yield out
