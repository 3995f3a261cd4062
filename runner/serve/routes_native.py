"""``POST /v1/tasks/{task}``: every task, natively, in the wire format of tasks/wire/native.py.

The body is the native job shape (tasks/wire/jobspec.py). Options that name paths are the server's
to fill, never the client's: a search corpus is one the operator named with ``--corpus``, an
image job and detect's drawing write into the request's own folder and come back as files, and
generate's ``json_schema`` is the schema itself (an object), written there too.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI
from fastapi import Path as TaskName  # the path's {task}: /openapi.json lists the tasks
from starlette.requests import Request

from taskrun.runner.serve.httpio import answer, json_body, ndjson, on_close, opened, release
from taskrun.tasks import REGISTRY
from taskrun.tasks.base import TaskError
from taskrun.tasks.wire.errors import APIError, from_task_error, invalid
from taskrun.tasks.wire.fields import MAX_INPUTS, MAX_TEXT_CHARS
from taskrun.tasks.wire.jobspec import JobSpec, Uploads, job_from_native
from taskrun.tasks.wire.native import collect_files, done_line, error_line, event_to_wire, openapi_body, scrub


def register(app: FastAPI, service) -> None:
    @app.post("/v1/tasks/{task}", openapi_extra=openapi_body())
    async def native(request: Request, task: str = TaskName(json_schema_extra={"enum": list(REGISTRY)})):
        body = await json_body(request)
        stream = body.pop("stream", False)
        if not isinstance(stream, bool):
            raise invalid("stream", "'stream' must be true or false")
        uploads = Uploads()
        running, streaming = None, False
        try:
            spec = native_spec(task, body, uploads, service.settings.corpora)
            if not stream:
                rec = await service.run(spec, request)
                files = await asyncio.to_thread(collect_files, task, rec, uploads.dir)
                job = scrub(
                    rec.to_json(), spec.inputs, uploads.dir, service.settings.corpora
                )  # after collect_files: names
                return answer({**job, "files": files} if files else job, rec.id)
            running = await service.start(spec, request, stream=True)
            events = await opened(running)
            streaming = True
        finally:
            if not streaming:
                release(uploads, running)

        return ndjson(_lines(spec, running, events, uploads, service.settings.corpora), on_close(running, uploads))


async def _lines(spec: JobSpec, running, events, uploads: Uploads, corpora: dict[str, str]):
    async for event in events:
        line = event_to_wire(event)
        if line is not None:
            yield scrub(line, spec.inputs, uploads.dir, corpora)
    try:
        rec = await running.result()
        files = await asyncio.to_thread(collect_files, spec.task, rec, uploads.dir)
    except APIError as exc:
        yield error_line(exc.body(), getattr(exc, "run_id", None))
        return
    yield done_line(scrub(rec.to_json(), spec.inputs, uploads.dir, corpora), files)


def native_spec(task: str, body: dict, uploads: Uploads, corpora: dict[str, str]) -> JobSpec:
    """The JobSpec of a native request, with the path options filled by the server."""
    if task not in REGISTRY:
        raise APIError(404, f"no task '{task}'; this server runs: {', '.join(REGISTRY)}", code="task_not_found")
    options = body.get("options")
    server_set: dict = {}
    if isinstance(options, dict):
        options = dict(options)
        server_set = _server_options(task, options, uploads, corpora)
        body = {**body, "options": options}
    try:
        spec = job_from_native(task, body, uploads=uploads, allow_paths=False)
    except TaskError as exc:
        raise from_task_error(exc) from None
    check_inputs(spec)
    spec.options.update(server_set)
    if task == "search" and "corpus" not in spec.options:
        spec.options["corpus"] = _corpus(None, corpora)
    if task == "image":
        spec.options["out_dir"] = str(uploads.dir)
    return spec


def check_inputs(spec: JobSpec) -> None:
    """The same limits as the OpenAI endpoints: inputs per job and characters per text."""
    if len(spec.inputs) > MAX_INPUTS:
        raise invalid("input", f"{len(spec.inputs)} inputs; the limit is {MAX_INPUTS} per request")
    for inp in spec.inputs:
        if inp.text is not None and len(inp.text) > MAX_TEXT_CHARS:
            raise invalid("input", f"{inp.source} is {len(inp.text):,} characters; the limit is {MAX_TEXT_CHARS:,}")


def _server_options(task: str, options: dict, uploads: Uploads, corpora: dict[str, str]) -> dict:
    """Pop the options that the server gives a meaning of its own, and return their values."""
    out: dict = {}
    if task == "search" and "corpus" in options:
        out["corpus"] = _corpus(options.pop("corpus"), corpora)
    if task == "detect" and options.get("annotate") not in (None, False):
        out["annotate"] = _annotation_target(options.pop("annotate"), uploads)
    elif task == "detect":
        options.pop("annotate", None)
    if task == "generate" and options.get("json_schema") not in (None, ""):
        schema = options.pop("json_schema")
        if not isinstance(schema, (dict, bool)):
            raise invalid(
                "options.json_schema", "options.json_schema is the JSON Schema itself (an object), not a file name"
            )
        path = uploads.dir / "schema.json"
        path.write_text(json.dumps(schema), encoding="utf-8")
        out["json_schema"] = str(path)
    return out


def _corpus(name, corpora: dict[str, str]) -> str:
    if name is None and len(corpora) == 1:
        return next(iter(corpora.values()))
    if name in corpora:
        return corpora[name]
    offered = ", ".join(corpora) or "none (its operator has served no corpus)"
    raise invalid(
        "options.corpus",
        f"options.corpus names one of this server's corpora: {offered}"
        + (f" (got {name!r})" if name is not None else ""),
    )


def _annotation_target(value, uploads: Uploads) -> str:
    """detect's annotate: true (one drawing per image, named after it) or a file name."""
    if value is True:
        folder = uploads.dir / "annotated"
        folder.mkdir(exist_ok=True)
        return str(folder)
    if not isinstance(value, str) or "/" in value or "\\" in value or value.startswith("."):
        raise invalid(
            "options.annotate",
            'options.annotate is true or a file name such as boxes.png (no folders); the drawing comes back in "files"',
        )
    return str(uploads.dir / value)
