"""A job's JSON (what `run TASK --json` prints) back into the objects a local run holds.

`run TASK --server URL` gets a job's record as JSON from the server and prints it exactly as a
local run does: the results must be the task's own Result dataclasses again, so that the task's
``render`` and ``write`` (text, srt, npy, png) give the same bytes. ``from_json`` builds any
dataclass from its type hints: nested dataclasses, lists, tuples (``tuple[Word, ...]``), dicts,
optional fields. Numbers keep their JSON type (an int stays an int, as ``to_jsonable`` printed it).

A field annotated ``Any`` keeps its JSON value: an embedding's vector comes back as a list of the
float32 values the server sent, not a numpy array. Every output is the same (``--json`` rounds
both alike, ``np.stack`` in the .npy writer gives the same float32 bytes, the text shows four
decimals), and a `--server` call need not import numpy (~0.15 s of CPU at every start).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from taskrun.runner.jobs import JobRecord
from taskrun.tasks import events as ev
from taskrun.tasks.base import ModelCard, Task, TaskError

COMMON_METRICS = ("load_s", "wall_s", "peak_rss_mb")


def from_json(tp: Any, value: Any) -> Any:
    """``value`` (parsed JSON) as an instance of the type ``tp``."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _from_union(typing.get_args(tp), value)
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return build(tp, value)
    if origin in (list, tuple) and isinstance(value, list):
        return _from_sequence(origin, typing.get_args(tp), value)
    if origin is dict and isinstance(value, dict):
        _, vt = typing.get_args(tp) or (Any, Any)
        return {k: from_json(vt, v) for k, v in value.items()}
    return value


def build(cls: type, data: dict) -> Any:
    """A dataclass from a JSON object: each field from its hint; missing fields (internal ones,
    never in JSON) keep their defaults; keys the class does not have are an error."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise TaskError(
            f"the server's {cls.__name__} has field(s) {', '.join(unknown)} that this "
            f"taskrun does not know; use the same taskrun version on both sides"
        )
    return cls(**{k: from_json(hints[k], v) for k, v in data.items()})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _from_union(args: tuple, value: Any) -> Any:
    """The first member of ``X | Y | None`` that the JSON value's shape fits."""
    for arg in args:
        if arg is type(None):
            continue
        if dataclasses.is_dataclass(arg) and isinstance(value, dict):
            return build(arg, value)
        base = typing.get_origin(arg) or arg
        if base in (list, tuple) and isinstance(value, list):
            return _from_sequence(base, typing.get_args(arg), value)
        if base is dict and isinstance(value, dict):
            return from_json(arg, value)
    return value


def _from_sequence(origin: type, args: tuple, value: list) -> Any:
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple(from_json(args[0], v) for v in value)
    if origin is tuple and args:
        return tuple(from_json(t, v) for t, v in zip(args, value))
    item = args[0] if args else Any
    out = [from_json(item, v) for v in value]
    return tuple(out) if origin is tuple else out


def find_type(root: type, keys: set[str]) -> type | None:
    """The dataclass under ``root`` (itself or a nested field's) whose fields are ``keys``: the
    type of a streamed ``Partial`` value, such as a transcript's Segment."""
    seen: set[type] = set()
    stack = [root]
    while stack:
        tp = stack.pop()
        if tp in seen:
            continue
        seen.add(tp)
        if dataclasses.is_dataclass(tp):
            if {f.name for f in dataclasses.fields(tp)} == keys:
                return tp
            stack += list(_hints(tp).values())
        stack += [a for a in typing.get_args(tp) if a is not Ellipsis]
    return None


# --------------------------------------------------------------------------- a job record


def card_of(model: dict | None, runtime: str | None, task: str) -> ModelCard | None:
    """The model card as far as a job's JSON tells it (what the metrics table and --json show)."""
    if not model:
        return None
    return ModelCard(
        name=model.get("name") or "",
        path=model.get("path") or "",
        architecture=model.get("architecture") or "",
        tasks=(task,),
        runtime=runtime or "",
        runtimes=(runtime or "",),
        size_bytes=0,
        digest=model.get("digest") or "",
        source=model.get("source") or "",
    )


def record_of(task: Task, job: dict, options: Any) -> JobRecord:
    """A JobRecord from the JSON of a finished job, with ``options`` (the caller's own Options, so
    the printed options are the ones the user gave). Sources are as the JSON has them."""
    try:
        metrics = dict(job.get("metrics") or {})
        common = {k: float(metrics.pop(k, 0.0) or 0.0) for k in COMMON_METRICS}
        rec = JobRecord(
            id=job["id"],
            task=job["task"],
            started_at=job.get("started_at", ""),
            options=options,
            card=card_of(job.get("model"), job.get("runtime"), task.name),
            runtime=job.get("runtime"),
            device=job.get("device"),
            dtype=job.get("dtype"),
            status=job.get("status", "ok"),
            error=job.get("error"),
            chain_id=job.get("chain_id"),
            stage=job.get("stage"),
            **common,
        )
        rec.items = [
            ev.Item(it["index"], it["input"], from_json(task.Result, it["result"])) for it in job.get("items") or []
        ]
        rec.errors = [ev.ItemError(e["index"], e["input"], e["error"]) for e in job.get("errors") or []]
        rec.metrics = build(task.Metrics, metrics)
    except (KeyError, TypeError) as exc:
        raise TaskError(
            f"the server's answer is not a {task.name} job as this taskrun knows it "
            f"({type(exc).__name__}: {exc}); use the same taskrun version on both sides"
        ) from None
    rec.n_inputs = len(rec.items) + len(rec.errors)
    return rec
