"""The native wire format of ``POST /v1/tasks/{task}``, which ``run TASK --server URL`` reads.

Request: the native job shape (tasks/wire/jobspec.py ``job_from_native``), plus ``"stream": true``
for events as they happen. Inputs that are files travel inline as ``{"data": <base64>, "name"}``.
Options that name paths on the server are refused, except where the server gives them a meaning
of its own: ``search``'s ``corpus`` names a corpus the operator passed to ``run serve --corpus
NAME=DIR``; ``detect``'s ``annotate`` is ``true`` or a file name, and the drawing comes back
in ``files``; ``image``'s images always come back in ``files``.

Response without streaming: exactly what ``run TASK --json`` prints (``JobRecord.to_json()``),
plus ``"files"`` for jobs that wrote files. The run id is also in the ``X-Taskrun-Run-Id`` header.

Response with streaming (``application/x-ndjson``), one JSON object per line:

    {"event": "token", "text": "Hel", "index": 0}                      generate, summarize
    {"event": "partial", "value": {...segment...}, "index": 0}         transcribe
    {"event": "step", "step": 3, "total": 25, "seconds": 0.08}         image
    {"event": "progress", "done": 10, "total": 40, "unit": "passages", "label": "indexing"}
    {"event": "notice", "message": "..."}                              a line for the user's stderr
    {"event": "item", "index": 0, "source": "...", "result": {...}}    each input's result
    {"event": "item_error", "index": 1, "source": "...", "message": "..."}
    {"event": "done", "job": {...to_json()...}, "files": [...]}        always last on success
    {"event": "error", "error": {"message", "type", "param", "code"}, "run_id": "..."}  last on failure

A job that fails before its first event (a bad option, an unknown model) is answered with its
4xx status and the error body ``{"error": {...}}``, as without streaming.

``files`` is a list of ``{"name": "a-fox-7.png", "data": <base64>}``; the paths inside ``job``
(an image's ``files``, detect's ``annotated``) are these names, and an uploaded input is named as
its client named it: no line carries a path of the server's. A client writes each file where it
wants and puts its own path there.
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

from taskrun.tasks import events as ev
from taskrun.tasks.base import to_jsonable
from taskrun.tasks.wire import fields

EVENT_NAMES: dict[type, str] = {
    ev.Token: "token",
    ev.Partial: "partial",
    ev.Step: "step",
    ev.Progress: "progress",
    ev.Notice: "notice",
    ev.Item: "item",
    ev.ItemError: "item_error",
}


def event_to_wire(event: Any) -> dict | None:
    """One line for a pipeline event; None for events that do not travel (``Done``: its metrics
    are in the final ``done`` line's job)."""
    name = EVENT_NAMES.get(type(event))
    if name is None:
        return None
    return {"event": name, **to_jsonable(event)}


def event_from_wire(line: dict) -> Any:
    """The pipeline event a line stands for (a client feeds it to its printer). Values that are
    task results (``partial``'s value, ``item``'s result) stay JSON; None for done/error."""
    cls = next((c for c, n in EVENT_NAMES.items() if n == line.get("event")), None)
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in line.items() if k in names})


def done_line(job: dict, files: list[dict]) -> dict:
    return {"event": "done", "job": job, "files": files}


def error_line(error_body: dict, run_id: str | None) -> dict:
    return {"event": "error", "error": error_body["error"], "run_id": run_id}


def scrub(line: dict, inputs: list, folder: Path, corpora: dict[str, str] | None = None) -> dict:
    """``line`` with the server's paths replaced: each uploaded input's by the name its client
    gave, anything else in the request's ``folder`` by its bare name, a served corpus folder by
    its NAME, and the model's folder left out (``model.path`` is null: the client has the name
    and the digest)."""
    import json

    text = json.dumps(line, ensure_ascii=False)
    for inp in inputs:
        if inp.path and str(inp.path).startswith(str(folder)):
            text = text.replace(json.dumps(str(inp.path))[1:-1], json.dumps(inp.source)[1:-1])
    text = text.replace(json.dumps(str(folder) + "/")[1:-1], "")
    for name, where in sorted((corpora or {}).items(), key=lambda kv: -len(kv[1])):
        text = text.replace(json.dumps(where)[1:-1], json.dumps(name)[1:-1])
    out = json.loads(text)
    for holder in (out, out.get("job")):
        model = holder.get("model") if isinstance(holder, dict) else None
        if isinstance(model, dict) and "path" in model:
            model["path"] = None
    return out


def collect_files(task: str, rec, folder: Path) -> list[dict]:
    """The files a job wrote for its client, as ``{"name", "data": base64}``, written into the
    request's own ``folder``: an image job's PNGs (written here as the CLI writes them), detect's
    drawings. The record's paths become the bare names, so its JSON shows no server path."""
    paths: list[Path] = []
    for result in rec.results:
        if task == "image":
            from taskrun.tasks.image import save

            paths += [Path(p) for p in save(result, None, str(folder))]
            for im in result.images:
                im.files = [Path(f).name for f in im.files]
        elif task == "detect" and getattr(result, "annotated", None):
            paths.append(Path(result.annotated))
            result.annotated = Path(result.annotated).name
    inside = [p for p in paths if Path(folder).resolve() in p.resolve().parents]  # never another file
    return [{"name": p.name, "data": base64.b64encode(p.read_bytes()).decode()} for p in inside]


# --------------------------------------------------------------------------- OpenAPI request body
# What job_from_native (tasks/wire/jobspec.py) and the route read: /openapi.json's schema of
# POST /v1/tasks/{task}.

_INPUT_ITEM = {
    "anyOf": [
        {"type": "string", "description": "a text"},
        {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {"type": "string", "description": "the file's bytes, base64 (or a data: URL)"},
                "name": {"type": "string", "description": "its name, as results report it"},
            },
        },
    ]
}
# the options a client names in place of a path (routes_native.py gives them their meaning)
_SERVER_SET = {
    "corpus": {"type": "string", "description": "search: a corpus the server serves, by NAME"},
    "annotate": {"type": ["boolean", "string"], "description": "detect: true or a file name; it comes back in files"},
    "json_schema": {"type": ["object", "boolean"], "description": "generate: the JSON Schema itself"},
}


def options_schema() -> dict:
    """Every task's options by name, typed as tasks/base.py's make_options checks them (one
    operation serves every task: a name two tasks share takes either's values)."""
    from taskrun.tasks import REGISTRY
    from taskrun.tasks.base import option_schema
    from taskrun.tasks.wire.jobspec import path_options

    props: dict[str, list[dict]] = {}
    for name, task in REGISTRY.items():
        paths = path_options(name)
        for f in dataclasses.fields(task.Options):
            schema = option_schema(f)
            if f.name not in paths and schema not in props.setdefault(f.name, []):
                props[f.name].append(schema)
    merged = {k: v[0] if len(v) == 1 else {"anyOf": v} for k, v in props.items()}
    return {
        "type": ["object", "null"],
        "properties": {**merged, **_SERVER_SET},
        "additionalProperties": False,
        "description": "the task's options by name, as `run tasks` lists them (one another task takes is a 400)",
    }


REQUEST_SCHEMA = {
    "type": "object",
    "properties": {
        "input": {"anyOf": [_INPUT_ITEM, {"type": "array", "items": _INPUT_ITEM}, {"type": "null"}]},
        "options": options_schema(),
        "model": {"type": ["string", "null"]},
        "runtime": {"type": ["string", "null"]},
        "id": {"description": "the caller's id for the job"},
        "task": {"description": "ignored: the path names the task"},
        "stream": {"type": "boolean", "description": "events as NDJSON lines as they happen"},
    },
    "additionalProperties": False,
}


def openapi_body() -> dict:
    """``openapi_extra`` for POST /v1/tasks/{task}."""
    return fields.openapi_body(REQUEST_SCHEMA)
