"""The OpenAI-compatible endpoints: request → JobSpec (tasks/wire/openai_api.py) → the model's worker → response.

Generate jobs always run with token events on, even when the answer is not streamed, so that a
client that goes away stops its generation at the next token either way.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import FastAPI
from starlette.requests import Request

from taskrun.runner.serve.httpio import answer, json_body, on_close, opened, release, sse
from taskrun.tasks import events as ev
from taskrun.tasks.wire import openai_api as oa
from taskrun.tasks.wire.errors import APIError
from taskrun.tasks.wire.jobspec import Uploads
from taskrun.tasks.wire.openai_out import CompletionChunks
from taskrun.tasks.wire.tools import tool_request


def register(app: FastAPI, service) -> None:
    @app.get("/v1/models")
    async def models():
        rows = await asyncio.to_thread(service.catalogue.rows)
        return {"object": "list", "data": [model_object(r) for r in rows]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        row = next((r for r in await asyncio.to_thread(service.catalogue.rows) if r["name"] == model), None)
        if row is None:
            raise APIError(
                404,
                f"no model named '{model}' on this server; GET /v1/models lists them",
                param="model",
                code="model_not_found",
            )
        return model_object(row)

    @app.post(oa.CHAT, openapi_extra=oa.openapi_body(oa.CHAT))
    async def chat(request: Request):
        return await completion(service, request, oa.CHAT)

    @app.post(oa.COMPLETIONS, openapi_extra=oa.openapi_body(oa.COMPLETIONS))
    async def completions(request: Request):
        return await completion(service, request, oa.COMPLETIONS)

    @app.post(oa.EMBEDDINGS, openapi_extra=oa.openapi_body(oa.EMBEDDINGS))
    async def embeddings(request: Request):
        body = await json_body(request)
        spec = oa.job_from_openai(oa.EMBEDDINGS, body, uploads=None)
        rec, run_id = await embed(service, spec, request)
        return answer(oa.openai_body(oa.EMBEDDINGS, spec, rec, body), run_id)

    for path in (oa.TRANSCRIPTIONS, oa.TRANSLATIONS):
        app.add_api_route(path, _audio_endpoint(service, path), methods=["POST"], openapi_extra=oa.openapi_body(path))

    @app.post(oa.IMAGES, openapi_extra=oa.openapi_body(oa.IMAGES))
    async def images(request: Request):
        return await simple(service, request, oa.IMAGES, await json_body(request))


def model_object(row: dict) -> dict:
    """An OpenAI model object, with what taskrun knows about it."""
    return {
        "id": row["name"],
        "object": "model",
        "created": row.get("created", 0),
        "owned_by": "taskrun",
        "tasks": row["tasks"],
        "digest": row["digest"],
        "runtime": row["runtime"],
        "size_bytes": row["size_bytes"],
        "description": row.get("description", ""),
    }


async def embed(service, spec, request: Request):
    """(the request's record, run id): batched with concurrent requests when batching is on."""
    if service.batcher is not None:
        rec, run_id = await service.batcher.run(spec, request)
    else:
        rec = await service.run(spec, request)
        run_id = rec.id
    if rec.status == "failed":
        raise APIError(400, "; ".join(e.describe() for e in rec.errors) or rec.error or "failed")
    return rec, run_id


async def simple(service, request: Request, path: str, body: dict):
    """Parse, run to the end, answer: images and audio (never streamed)."""
    uploads = Uploads()
    try:
        spec = oa.job_from_openai(path, body, uploads=uploads)
        rec = await service.run(spec, request)
        return answer(oa.openai_body(path, spec, rec, body), rec.id)
    finally:
        uploads.close()


def _audio_endpoint(service, path: str):
    async def audio(request: Request):
        form = await request.form()
        try:
            body = {}
            for key in set(form.keys()):
                values = form.getlist(key)
                body[key] = values if key.startswith("timestamp_granularities") else values[-1]
            upload = body.get("file")
            if upload is not None and hasattr(upload, "read"):
                body["file"] = (upload.filename or "audio", await upload.read())
            return await simple(service, request, path, body)
        finally:
            await form.close()

    audio.__name__ = path.rsplit("/", 1)[-1]
    return audio


async def completion(service, request: Request, path: str):
    body = await json_body(request)
    uploads = Uploads()
    running, streaming = None, False
    try:
        spec = oa.job_from_openai(path, body, uploads=uploads)
        streamed = spec.options["stream"]
        spec.options["stream"] = True  # token events: a client that leaves stops the job (see above)
        running = await service.start(spec, request, stream=streamed)
        if not streamed:
            rec = await running.result()
            return answer(oa.openai_body(path, spec, rec, body), rec.id)
        events = await opened(running)
        streaming = True
    finally:
        if not streaming:
            release(uploads, running)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    asked = tool_request(body) if path == oa.CHAT else None
    chunks = CompletionChunks(path == oa.CHAT, spec.model, include_usage, uuid.uuid4().hex[:24], asked)

    return sse(_completion_chunks(running, events, chunks), on_close(running, uploads))


async def _completion_chunks(running, events, chunks: CompletionChunks):
    for chunk in chunks.start():
        yield chunk
    async for event in events:
        if isinstance(event, ev.Token):
            for chunk in chunks.piece(event.text, event.index):
                yield chunk
    try:
        rec = await running.result()
    except APIError as exc:
        yield {**exc.body(), "run_id": getattr(exc, "run_id", None)}
        return
    for chunk in chunks.end(rec):
        yield chunk
    yield "[DONE]"
