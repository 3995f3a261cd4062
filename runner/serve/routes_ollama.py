"""The Ollama-compatible endpoints: /api/tags, /api/generate, /api/chat, /api/embed.

As Ollama does, generate and chat stream NDJSON unless the body says ``"stream": false``; the
last object has ``done: true``, ``done_reason`` and the timings (and ``run_id``, which a
header cannot carry once a stream has started).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from starlette.requests import Request

from taskrun.runner.serve.httpio import answer, json_body, ndjson, on_close, opened, release
from taskrun.runner.serve.routes_ollama_info import load_only, unload_if_asked
from taskrun.runner.serve.routes_openai import embed
from taskrun.tasks import events as ev
from taskrun.tasks.wire import ollama_api as ol
from taskrun.tasks.wire.errors import APIError
from taskrun.tasks.wire.jobspec import Uploads
from taskrun.tasks.wire.tool_stream import ToolStream


def register(app: FastAPI, service) -> None:
    @app.get("/api/tags")
    async def tags():
        return ol.tags_body(await asyncio.to_thread(service.catalogue.rows))

    @app.post("/api/generate", openapi_extra=ol.openapi_body("/api/generate"))
    async def generate(request: Request):
        return await _text(service, request, chat=False)

    @app.post("/api/chat", openapi_extra=ol.openapi_body("/api/chat"))
    async def chat(request: Request):
        return await _text(service, request, chat=True)

    @app.post("/api/embed", openapi_extra=ol.openapi_body("/api/embed"))
    async def embed_endpoint(request: Request):
        t0 = time.perf_counter()
        body = await json_body(request)
        spec = ol.embed_spec(body)
        rec, run_id = await embed(service, spec, request)
        if body.get("truncate") is False and any(r.truncated for r in rec.results):
            raise APIError(
                400,
                "an input is longer than the model's context window; shorten it or leave truncate on",
                param="input",
            )
        await unload_if_asked(body, rec)
        return answer(ol.embed_body(spec.model, rec, time.perf_counter() - t0), run_id)


async def _text(service, request: Request, chat: bool):
    t0 = time.perf_counter()
    body = await json_body(request)
    if ol.load_only(body, chat):  # Ollama's idiom: no prompt loads (or, keep_alive 0, unloads) the model
        return await load_only(service, body, chat)
    uploads = Uploads()
    running, streaming = None, False
    try:
        spec = ol.chat_spec(body, uploads) if chat else ol.generate_spec(body, uploads)
        asked = ol.chat_tools(body) if chat else None
        streamed = body.get("stream", True) is not False
        running = await service.start(spec, request, stream=streamed)
        if not streamed:
            rec = await running.result()
            text = rec.results[0].text if rec.results else ""
            await unload_if_asked(body, rec)
            return answer(ol.final_line(chat, spec.model, rec, time.perf_counter() - t0, text, asked), rec.id)
        events = await opened(running)
        streaming = True
    finally:
        if not streaming:
            release(uploads, running)

    return ndjson(_lines(chat, spec.model, running, events, t0, asked, body), on_close(running, uploads))


async def _lines(chat: bool, model: str, running, events, t0: float, asked, body: dict):
    calls = ToolStream(asked) if asked is not None else None  # with tools: text streamed, calls once complete
    async for event in events:
        if not isinstance(event, ev.Token):
            continue
        if calls is None:
            yield ol.text_line(chat, model, event.text)
        else:
            for line in ol.stream_lines(model, calls.feed(event.text)):
                yield line
    try:
        rec = await running.result()
    except APIError as exc:
        yield {"error": exc.message, "run_id": getattr(exc, "run_id", None)}  # Ollama's shape
        return
    if calls is not None and rec.results:
        for line in ol.stream_lines(model, calls.close(rec.results[0])):
            yield line
    await unload_if_asked(body, rec)
    yield ol.final_line(chat, model, rec, time.perf_counter() - t0)
