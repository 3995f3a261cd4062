"""What every endpoint does with HTTP: read a JSON body, answer with the run id, stream lines.

Streams are opened only once the job has produced its first event: a job that fails before any
output (an unknown option, a prompt too long, a model that cannot load) is answered with its
4xx status and the error body, as without streaming. After the first line the status is sent, so
a later failure is the stream's last line, and the run id rides in the last line too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from taskrun.tasks.base import to_jsonable
from taskrun.tasks.wire.fields import read_json
from taskrun.tasks.wire.jobspec import Uploads

RUN_ID_HEADER = "X-Taskrun-Run-Id"
_NOTHING = object()


async def json_body(request: Request) -> dict:
    """The request's JSON object, read by the one strict reader every door shares (tasks/wire/fields.py)."""
    return read_json(await request.body(), request.headers.get("content-type"))


def run_headers(run_id: str | None) -> dict[str, str]:
    return {RUN_ID_HEADER: run_id} if run_id else {}


def answer(body: Any, run_id: str | None, status: int = 200) -> Response:
    """A JSON object, or text (transcripts as text, srt, vtt), with the run id header."""
    if isinstance(body, str):
        return Response(body, status_code=status, headers=run_headers(run_id), media_type="text/plain; charset=utf-8")
    return JSONResponse(to_jsonable(body), status_code=status, headers=run_headers(run_id))


def release(uploads: Uploads | None, running=None) -> None:
    """Remove the request's files once nothing uses them: now, or when its job ends (a job whose
    client left still runs until its next event)."""
    if uploads is None:
        return
    if running is None or running.future.done():
        uploads.close()
    else:
        running.future.add_done_callback(lambda _: uploads.close())


def on_close(running, uploads: Uploads | None) -> Callable[[], None]:
    """What a stream does when it ends or its client leaves: cancel the job (it stops at its next
    event) and release the request's files once the job is done with them."""

    def close() -> None:
        running.cancel()
        release(uploads, running)

    return close


async def opened(running) -> AsyncIterator[Any]:
    """The job's events, once the first has come: a job that ended without any raises its
    error here, before a stream is answered."""
    events = running.events()
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        first = _NOTHING
        await running.result()  # raises the job's APIError

    async def rest():
        if first is not _NOTHING:
            yield first
        async for event in events:
            yield event

    return rest()


def ndjson(lines: AsyncIterator[dict], on_close: Callable[[], None], run_id: str | None = None) -> Response:
    """A streamed ``application/x-ndjson`` response, one JSON object per line."""

    async def body():
        try:
            async for line in lines:
                # The lines are JSON already (tasks/wire/native.py made them): a second to_jsonable pass would
                # round the full-precision vectors to 6 decimals, and `-o x.npy` through a
                # server would no longer equal the local file.
                yield json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=to_jsonable) + "\n"
        finally:
            on_close()

    return StreamingResponse(body(), media_type="application/x-ndjson", headers=run_headers(run_id))


def sse(chunks: AsyncIterator[dict | str], on_close: Callable[[], None], named: bool = False) -> Response:
    """Server-sent events as OpenAI streams them: ``data: {json}`` per chunk, ``data: [DONE]`` last;
    ``named``: each event also has its ``event:`` line, the chunk's ``type`` (the Responses API)."""
    from sse_starlette import EventSourceResponse

    async def body():
        try:
            async for chunk in chunks:
                event = {
                    "data": chunk
                    if isinstance(chunk, str)
                    else json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
                }
                if named and isinstance(chunk, dict):
                    event["event"] = chunk["type"]
                yield event
        finally:
            on_close()

    return EventSourceResponse(body(), sep="\n", ping=15)
