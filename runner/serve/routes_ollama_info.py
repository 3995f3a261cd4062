"""Ollama's surface beyond generation: ``GET /`` and ``HEAD /`` ("Ollama is running"),
/api/version, /api/show, /api/ps, the legacy /api/embeddings, and /api/pull and /api/delete
refused with a clear Ollama-shaped error (tasks/wire/ollama_info.py)."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from taskrun.runner.serve.httpio import answer, json_body
from taskrun.runner.serve.routes_openai import embed
from taskrun.tasks.wire import ollama_api as ol
from taskrun.tasks.wire import ollama_info as info
from taskrun.tasks.wire.jobspec import JobSpec


def register(app: FastAPI, service) -> None:
    @app.get("/")
    @app.head("/", operation_id="root_head")  # its own id: one shared id makes /openapi.json ambiguous
    async def root():
        return PlainTextResponse("Ollama is running")

    @app.get("/api/version")
    async def version():
        return {"version": info.OLLAMA_API_VERSION}

    @app.post("/api/show", openapi_extra=ol.openapi_body("/api/show"))
    async def show(request: Request):
        from taskrun.models.chat_info import chat_info

        body = await json_body(request)
        row = info.find(await asyncio.to_thread(service.catalogue.rows), body)
        return info.show_body(row, await asyncio.to_thread(chat_info, row["path"]))

    @app.get("/api/ps")
    async def ps():
        from taskrun.pipelines import cache_info

        rows = await asyncio.to_thread(service.catalogue.rows)
        return info.ps_body(rows, {e["digest"] for e in cache_info()})

    @app.post("/api/embeddings", openapi_extra=ol.openapi_body("/api/embeddings"))
    async def embeddings(request: Request):
        """The legacy endpoint: ``prompt`` → one ``embedding``."""
        t0 = time.perf_counter()
        body = await json_body(request)
        spec = ol.embed_spec(body)
        rec, run_id = await embed(service, spec, request)
        await unload_if_asked(body, rec)
        vectors = ol.embed_body(spec.model, rec, time.perf_counter() - t0)["embeddings"]
        return answer({"embedding": vectors[0] if vectors else []}, run_id)

    @app.post("/api/pull", openapi_extra=ol.openapi_body("/api/pull"))
    async def pull(request: Request):
        raise info.pull_refused(await json_body(request), await asyncio.to_thread(service.catalogue.rows))

    @app.delete("/api/delete", openapi_extra=ol.openapi_body("/api/delete"))
    async def delete(request: Request):
        raise info.delete_refused(await json_body(request))


async def unload_if_asked(body: dict, rec) -> None:
    """Ollama's ``keep_alive: 0``: the model is unloaded once its request is done."""
    if ol.keep_alive(body) == 0 and getattr(rec, "card", None) is not None:
        from taskrun.pipelines import unload

        await asyncio.to_thread(unload, rec.card.digest)


async def load_only(service, body: dict, chat: bool):
    """A request with no prompt (no messages): load the model on its worker, or with
    ``keep_alive: 0`` unload it, and answer ``done_reason`` "load" or "unload" as Ollama does."""
    from taskrun.pipelines import load_pipeline, unload

    name = await service.model_for(JobSpec("generate", [], {}, model=ol.ollama_model(body)))
    card = await asyncio.to_thread(service.catalogue.card, name)
    if ol.keep_alive(body) == 0:
        await asyncio.to_thread(unload, card.digest)
        reason = "unload"
    else:
        settings = service.settings

        def load():
            with service.loads.loading((name, "generate", None)):
                load_pipeline("generate", card, card.runtime, settings.device, settings.dtype)

        worker = service.workers.get(name)
        worker.admit()
        await worker.run(load)
        reason = "load"
    line = ol.text_line(chat, name, "")
    return {**line, "done": True, "done_reason": reason}
