"""Items → jobs → output lines: the part of `run batch` both engines run (the local one in this
process or its pool, the Ray one inside each actor).

Each line is parsed by the parser of its format (``job_from_native`` for taskrun jobs, the
server's ``job_from_openai`` for OpenAI requests), with paths on this machine allowed: the batch
runs on the operator's own files. Items are grouped by (task, model, runtime, options) so each
model is loaded once (the pipelines' in-process cache keeps it between jobs). Tasks whose
pipelines run many inputs per forward pass (``BATCHED``) get one ``run_job`` per ``chunk`` items
of a group; the others one job per item, so each transcript or generation has its own metrics
and its line is written the moment it is done.

Every job goes through ``run_job`` (checks, run log, metrics), linked to the batch by the run
log's ``chain_id`` (`run logs --chain BATCH_ID` lists a batch's jobs and its summary row).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from taskrun.runner.batch.lines import (
    Failure,
    model_of,
    native_line,
    openai_line,
    write_side_files,
)
from taskrun.runner.batch.source import OPENAI, Entry
from taskrun.tasks import events as ev
from taskrun.tasks import get_task
from taskrun.tasks.base import TaskError

# Pipelines that batch forward passes across inputs (or, for search, index the corpus once per job).
BATCHED = {"embed", "classify", "detect", "search"}


@dataclass
class Context:
    """What every job of the batch shares. Plain values only: it travels to pool processes and
    Ray actors."""

    batch_id: str
    device: str = "auto"
    dtype: str = "auto"
    offline: bool = False
    out_dir: str | None = None
    model: str | None = None  # for lines that name none
    runtime: str | None = None
    options: dict = field(default_factory=dict)  # under each taskrun line's own options
    chunk: int = 256  # items per job of a batched task


@dataclass
class Finished:
    """A finished job's lines, with what the progress and the summary count."""

    lines: list[dict]
    task: str | None = None  # None: items that failed before any job
    wall_s: float = 0.0  # the job's wall time (0 when no job ran)

    def failed(self) -> int:
        return sum(
            1
            for x in self.lines
            if x.get("status") == "failed" or (x.get("response") or {}).get("status_code", 200) != 200
        )


@dataclass
class Prepared:
    """An item parsed into its job, or the reason it cannot run."""

    entry: Entry
    spec: Any = None  # JobSpec
    failure: Failure | None = None

    @property
    def key(self) -> tuple:
        s = self.spec
        return s.task, s.model, s.runtime, json.dumps(s.options, sort_keys=True, default=str)


class LogTap:
    """The run log as ``run_job`` sees it: each row is kept (the run id and model of a job that
    raised) and passed on to ``log`` (a RunLog, a list, or None)."""

    def __init__(self, log) -> None:
        self.log, self.row = log, None

    def append(self, row: dict) -> None:
        self.row = row
        if self.log is not None:
            self.log.append(row)


def prepare(entry: Entry, ctx: Context, uploads) -> Prepared:
    try:
        if entry.flavour == OPENAI:
            return Prepared(entry, spec=_openai_spec(entry.line, ctx, uploads))
        return Prepared(entry, spec=_native_spec(entry.line, ctx, uploads))
    except Exception as exc:  # a bad line is that item's error; the batch goes on
        if not isinstance(exc, TaskError) and not hasattr(exc, "status"):
            _trace()
        return Prepared(entry, failure=Failure.of(exc))


def _native_spec(line: dict, ctx: Context, uploads):
    from taskrun.tasks.wire.jobspec import job_from_native

    name = line.get("task")
    if not isinstance(name, str):
        raise TaskError('the job names no task; add "task": "embed" (or another from `run tasks`)')
    task = get_task(name)
    body = dict(line)
    if body.get("model") is None and ctx.model:
        body["model"] = ctx.model
    if body.get("runtime") is None and ctx.runtime:
        body["runtime"] = ctx.runtime
    if ctx.options and isinstance(body.get("options") or {}, dict):
        body["options"] = {**ctx.options, **(body.get("options") or {})}
    if "text" not in task.input_kinds:  # a file task: a string is a path, even a missing one
        body["input"] = _as_paths(body.get("input"))
    return job_from_native(name, body, uploads=uploads, allow_paths=True)


def _as_paths(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_paths(v) for v in value]
    return {"path": value} if isinstance(value, str) else value


def _openai_spec(line: dict, ctx: Context, uploads):
    from taskrun.tasks.wire.errors import APIError, invalid
    from taskrun.tasks.wire.openai_api import job_from_openai

    if line.get("method", "POST") != "POST":
        raise invalid("method", f'"method" must be "POST" (got {json.dumps(line.get("method"))})')
    url, body = line.get("url"), line.get("body")
    if not isinstance(url, str) or not isinstance(body, dict):
        raise APIError(
            400,
            'an OpenAI Batch request needs "url" (e.g. "/v1/embeddings") and a "body" object',
            param="url" if not isinstance(url, str) else "body",
        )
    if body.get("stream"):
        raise invalid("stream", 'a batch answers each request whole; drop "stream"')
    if not body.get("model") and ctx.model:
        body = {**body, "model": ctx.model}
    return job_from_openai(url, body, uploads=uploads, allow_paths=True)


def plan(prepared: list[Prepared], chunk: int) -> Iterator[list[Prepared]]:
    """The jobs for a window of parsed items: per group, ``chunk`` items at a time for batched
    tasks (shortest texts first), one item at a time for the others. Groups keep the order of
    their first item."""
    groups: dict[tuple, list[Prepared]] = {}
    for p in prepared:
        if p.spec is not None:
            groups.setdefault(p.key, []).append(p)
    for key, items in groups.items():
        step = chunk if key[0] in BATCHED else 1
        if step > 1:  # texts of like length in one job: its batches pad less (as one job sorts them)
            items = sorted(items, key=lambda p: sum(len(i.text or "") for i in p.spec.inputs))
        for i in range(0, len(items), step):
            yield items[i : i + step]


def failed_lines(prepared: list[Prepared]) -> Finished:
    """The lines of items that failed before any job (a bad line, option or path)."""
    return Finished([_line(p, None, p.failure, None, None) for p in prepared if p.failure is not None])


def run_items(items: list[Prepared], ctx: Context, log) -> Finished:
    """Run one job over ``items`` (they share task, model and options) → their lines.

    A job that raises something other than a TaskError (a bug, or a crash caused by one input)
    is run again one item at a time, so only the item at fault fails."""
    from taskrun.runner.inputs import options_from
    from taskrun.runner.jobs import run_job

    spec = items[0].spec
    task = get_task(spec.task)
    inputs, spans = [], []
    for p in items:
        spans.append((len(inputs), len(inputs) + len(p.spec.inputs)))
        inputs += p.spec.inputs
    errors: dict[int, str] = {}
    tap = LogTap(log)

    def on_event(e: Any) -> None:
        if isinstance(e, ev.ItemError):
            errors[e.index] = e.describe()

    values = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.options.items()}  # JSON → Options
    rec, job_error = None, None
    try:
        rec = run_job(
            task,
            lambda: inputs,
            lambda: options_from(task, values),
            model=spec.model,
            runtime=spec.runtime,
            device=ctx.device,
            dtype=ctx.dtype,
            offline=ctx.offline,
            log=tap,
            on_event=on_event,
            chain_id=ctx.batch_id,
        )
    except TaskError as exc:
        job_error = Failure.of(exc)
    except Exception as exc:
        _trace()
        if len(items) > 1:
            alone = [run_items([p], ctx, log) for p in items]
            return Finished([x for f in alone for x in f.lines], spec.task, sum(f.wall_s for f in alone))
        job_error = Failure.of(exc)
    lines = [_item_line(p, rec, lo, hi, errors, job_error, tap.row, ctx) for p, (lo, hi) in zip(items, spans)]
    wall = rec.wall_s if rec is not None else ((tap.row or {}).get("metrics") or {}).get("wall_s", 0.0)
    return Finished(lines, spec.task, wall)


def _item_line(
    p: Prepared,
    rec,
    lo: int,
    hi: int,
    errors: dict[int, str],
    job_error: Failure | None,
    row: dict | None,
    ctx: Context,
) -> dict:
    mine = [errors[i] for i in range(lo, hi) if i in errors]
    if mine:
        return _line(p, rec, Failure("; ".join(mine)), row, None)
    if job_error is not None or rec is None:
        return _line(p, rec, job_error or Failure("the job gave no result"), row, None)
    sub = part(rec, lo, hi)
    if len(sub.items) != hi - lo:
        return _line(p, rec, Failure(f"the job gave {len(sub.items)} results for {hi - lo} inputs"), row, None)
    try:
        return _line(p, rec, None, row, sub, ctx)
    except Exception as exc:  # a side file that cannot be written, an answer that cannot be built
        _trace()
        return _line(p, rec, Failure.of(exc), row, None)


def _trace() -> None:
    """With TASKRUN_DEBUG set, the traceback of an unexpected error goes to stderr (the item's
    line carries its message either way)."""
    import os
    import traceback

    if os.environ.get("TASKRUN_DEBUG", "") not in ("", "0"):
        traceback.print_exc()


def part(rec, lo: int, hi: int):
    """The record of inputs ``lo:hi`` of a job that ran several lines' inputs together, indexed
    from 0 as if they had been a job of their own."""
    items = [replace(it, index=it.index - lo) for it in rec.items if lo <= it.index < hi]
    errs = [replace(e, index=e.index - lo) for e in rec.errors if lo <= e.index < hi]
    return replace(rec, items=items, errors=errs, n_inputs=hi - lo)


def _line(p: Prepared, rec, failure: Failure | None, row: dict | None, sub, ctx: Context | None = None) -> dict:
    run_id = rec.id if rec is not None else (row or {}).get("id")
    if p.entry.flavour == OPENAI:
        body = None
        if failure is None:
            from taskrun.tasks.wire.openai_api import openai_body

            if ctx.out_dir:
                _files(p, sub, ctx)
            body = openai_body(p.entry.line["url"], p.spec, sub, p.entry.line["body"])
        return openai_line(p.entry.id, body=body, failure=failure, run_id=run_id)
    task = p.spec.task if p.spec is not None else str(p.entry.line.get("task") or "?")
    if failure is not None:
        metrics = rec.metrics_dict() if rec is not None else None
        return native_line(p.entry.id, task, failure=failure, metrics=metrics, model=model_of(rec, row), run_id=run_id)
    files = _files(p, sub, ctx)
    results = sub.results
    result = results if isinstance(p.entry.line.get("input"), list) else results[0]
    metrics = {**rec.metrics_dict(), "job_items": rec.n_inputs}
    return native_line(
        p.entry.id, task, result=result, metrics=metrics, model=model_of(rec, row), run_id=run_id, files=files
    )


def _files(p: Prepared, sub, ctx: Context) -> list[str]:
    task = get_task(p.spec.task)
    out: list[str] = []
    several = len(sub.results) > 1
    for i, result in enumerate(sub.results):
        item_id = f"{p.entry.id}-{i + 1}" if several else p.entry.id
        out += write_side_files(task, item_id, result, sub.options, ctx.out_dir)
    return out


def run_window(entries: list[Entry], ctx: Context, log) -> Iterator[Finished]:
    """All the lines of a window of items, a job's worth at a time, in a private folder for any
    bytes the lines carry (removed when the window is done)."""
    from taskrun.tasks.wire.jobspec import Uploads

    with Uploads() as uploads:
        prepared = [prepare(e, ctx, uploads) for e in entries]
        bad = failed_lines(prepared)
        if bad.lines:
            yield bad
        for items in plan(prepared, ctx.chunk):
            fin = run_items(items, ctx, log)
            release_memory()
            yield fin


def release_memory() -> None:
    """Give the heap's free pages back to the system after a job (glibc's ``malloc_trim``).

    A job's activations are freed when it ends, but glibc keeps the pages, fragmented, and the
    next job's differently shaped tensors do not fit them, so the process grows job after job.
    Measured on 20,000 minilm embeddings (79 jobs of 256): resident memory between jobs 580 to
    655 MB and creeping without, a flat 487 MB with; peak 840 → 918 MB without, 837 → 879 with.
    A no-op where there is no glibc."""
    import ctypes
    import ctypes.util

    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None  # glibc's malloc_trim, once looked up (False: not available)
