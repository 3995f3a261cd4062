"""`run TASK … --server URL`: the job runs on a warm `run serve`; the output is a local run's.

The client reads its own inputs (texts, and files sent as bytes: a server never takes a path),
sends them to ``POST URL/v1/tasks/TASK`` with the options the user set, renders the streamed
events as they come (tokens, transcript segments, progress) and rebuilds the finished job from
the server's ``run TASK --json`` record, so the local writers print and write the same text,
JSON, srt, npy and png. Nothing is logged here: the server logs the job, and its run id is in
the metrics table.

Options that name paths travel as follows (``PATH_OPTIONS``):
  json_schema (generate)  the schema file is read here and sent inline
  corpus (search)         names a corpus the server was started with, not a local folder
  annotate (detect)       the boxes are drawn here, on the local image, from the returned result
  out_dir (image)         the returned images are written here

A ``--then`` chain, ``run chain`` and ``run ask`` still run locally.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from taskrun.runner.inputs import gather_inputs, options_from
from taskrun.runner.remote.records import find_type, from_json, record_of
from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, Task, TaskError, to_jsonable

PATH_OPTIONS = {"json_schema": "inline", "corpus": "name", "annotate": "local", "out_dir": "local"}


def execute_remote(
    task: Task,
    *,
    server: str,
    api_key: str | None,
    inputs,
    files,
    values,
    model,
    runtime,
    device,
    dtype,
    json_mode,
    fmt,
    output,
    quiet,
) -> None:
    """A task command's job, run on the server at ``server``; printed and written as `execute` does."""
    from taskrun.runner.output.paths import job_paths
    from taskrun.runner.output.writer import EventPrinter, check_output_path, emit, pick_format
    from taskrun.runner.remote.http import stream_job

    if device != "auto" or dtype != "auto":
        raise TaskError(
            "--device and --dtype are the server's choice with --server (see `run serve "
            "--help`); drop them, or run the job here without --server"
        )
    fmt = pick_format(task, fmt, output)
    json_mode = json_mode or fmt == "json"
    if output:  # as a local run refuses it, before anything is sent: -o must not be one of the inputs
        # (a corpus names one on the server, not a local file)
        read = {k: v for k, v in values.items() if PATH_OPTIONS.get(k) != "name"}
        check_output_path(output, job_paths(task, inputs, files, read))
    options = local_options(task, values, fmt)
    given = gather_inputs(task, inputs, files)
    names = Sources(task, given)
    # As execute.CommandView shows a first stage: the items of a file format (srt, npy) are not
    # printed, the file is the result.
    printer = EventPrinter(
        task, options, json_mode=json_mode, quiet=quiet, show_items=fmt in (None, "text") or json_mode
    )
    events = EventReader(task, names, printer)
    body = {
        "input": wire_inputs(task, given),
        "options": wire_options(task, options),
        "model": model,
        "runtime": runtime,
        "stream": True,
    }
    done = stream_job(server, api_key, task.name, body, events, names.text)
    rec = record_of(task, names.job(done.get("job") or {}), options)
    attach_images(task, rec, done.get("files") or [])
    draw_annotations(task, rec, given)
    _show(rec, printer, events)
    emit(task, rec, fmt, output, json_mode, quiet)
    if rec.errors:
        raise click.ClickException(
            f"{len(rec.errors)} of {rec.n_inputs} inputs failed (see the errors above); the others finished"
        )


def _show(rec, printer, events: EventReader) -> None:
    """What the stream did not show already: failed inputs, then the items, then the numbers."""
    for err in rec.errors:
        if err.index not in events.errors_shown:
            printer(err)
    for item in sorted(rec.items, key=lambda i: i.index):
        printer(item)
    printer(ev.Done(rec.metrics))


# --------------------------------------------------------------------------- the request


def local_options(task: Task, values: dict[str, Any], fmt: str | None = None) -> Any:
    """The Options the user gave, checked here (the same errors as a local run, before anything is
    sent), with what the output format needs (srt asks for word timestamps), as a local run sets
    them. An option that names something on the server (a corpus) is not checked as a local path."""
    remote = {
        f.name: values.get(f.name, f.default)
        for f in dataclasses.fields(task.Options)
        if PATH_OPTIONS.get(f.name) == "name"
    }
    options = options_from(task, {**values, **{k: "." for k in remote}}, fmt)
    for k, v in remote.items():
        # Frozen: set past the local path check, as sent. Left empty, the server picks (its
        # only corpus) or says which names it has.
        object.__setattr__(options, k, v)
    return options


def wire_inputs(task: Task, inputs: list[Input]) -> list[dict]:
    """Texts as ``{"text"}``; files as their bytes, ``{"data": base64, "name": basename}`` (a text
    file too, for a task that does not take text: the server then refuses it as a local run does)."""
    out = []
    for inp in inputs:
        if inp.text is not None and ("text" in task.input_kinds or not inp.path):
            out.append({"text": inp.text})
        else:
            data = Path(inp.path).read_bytes()
            out.append({"data": base64.b64encode(data).decode("ascii"), "name": Path(inp.path).name})
    return out


def wire_options(task: Task, options: Any) -> dict[str, Any]:
    """The options that differ from their defaults, as JSON; path options as PATH_OPTIONS says."""
    # jobspec.path_options, read here without importing jobspec (tempfile, shutil: start-up time)
    paths = {f.name for f in dataclasses.fields(task.Options) if f.metadata.get("path")}
    out = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value == f.default:
            continue
        if f.name not in paths:
            out[f.name] = to_jsonable(value)
            continue
        how = PATH_OPTIONS.get(f.name)
        if how is None:
            raise TaskError(
                f"--{f.name.replace('_', '-')} names a file here, which `{task.name}` cannot "
                f"send to a server yet; run the job without --server"
            )
        if how == "inline":
            out[f.name] = json.loads(Path(value).read_text(encoding="utf-8"))
        elif how == "name":
            out[f.name] = value
    return out


# --------------------------------------------------------------------------- the answer


class Sources:
    """The server names the inputs as they reached it (a file by the name it was sent under, a
    text as "input 2", a temporary upload path where it has not scrubbed one); a local run names
    them as the user did. This maps the first to the second, in results, errors and messages."""

    _UPLOAD = re.compile(r"(?:/[^/\s'\"]+)*/taskrun-upload-[A-Za-z0-9_]+/(\d{4})-([A-Za-z0-9._-]+)")

    def __init__(self, task: Task, inputs: list[Input]) -> None:
        self.local = [inp.describe() for inp in inputs]
        n = len(inputs)
        self.sent: list[str | None] = []  # the name each file was sent under (None: a text)
        self.uploads: dict[int, tuple[str, str]] = {}  # k-th upload → (its file name there, local name)
        for i, inp in enumerate(inputs):
            name = Path(inp.path).name if inp.path and (inp.text is None or "text" not in task.input_kinds) else None
            self.sent.append(name)
            if name is not None:  # named on the server's disk as jobspec.Uploads.add names it
                safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80].lstrip(".") or "upload"
                self.uploads[len(self.uploads) + 1] = (safe, self.local[i])
        # As jobspec.native_inputs names a job's inputs.
        self.aliases = [{name, f"input {i + 1}" if n > 1 else "input"} - {None} for i, name in enumerate(self.sent)]
        sent = [x for x in self.sent if x]
        self.unique = {x: self.local[self.sent.index(x)] for x in sent if sent.count(x) == 1}

    def text(self, s: str, index: int | None = None) -> str:
        """A message with the server's names of the inputs (upload paths, names sent) as given here."""
        if "taskrun-upload-" in s:
            s = self._UPLOAD.sub(self._upload, s)
        known = (
            self.unique
            if index is None or not 0 <= index < len(self.sent) or not self.sent[index]
            else {self.sent[index]: self.local[index]}
        )
        for name, local in known.items():
            if name != local and name in s:
                s = re.sub(rf"(?<![\w./-]){re.escape(name)}(?![\w-])", lambda m, local=local: local, s)
        return s

    def _upload(self, m: re.Match) -> str:
        safe, name = self.uploads.get(int(m.group(1)), ("", m.group(0)))
        rest = m.group(2)
        return name + (rest[len(safe) :] if safe and rest.startswith(safe) else "")

    def source(self, index: int, s: str) -> str:
        if 0 <= index < len(self.local) and s in self.aliases[index]:
            return self.local[index]
        return self.text(s, index)

    def value(self, index: int, v: Any) -> Any:
        """A result's JSON with the file's name as sent (a transcript's source, a detect input)
        replaced by the local name; texts in it are left alone."""
        if isinstance(v, str):
            if 0 <= index < len(self.sent) and v == self.sent[index]:
                return self.local[index]
            return self._UPLOAD.sub(self._upload, v) if "taskrun-upload-" in v else v
        if isinstance(v, list):
            return [self.value(index, x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(index, x) for k, x in v.items()}
        return v

    def job(self, job: dict) -> dict:
        job = dict(job)
        job["items"] = [
            {**it, "input": self.source(it["index"], it["input"]), "result": self.value(it["index"], it["result"])}
            for it in job.get("items") or []
        ]
        job["errors"] = [
            {**e, "input": self.source(e["index"], e["input"]), "error": self.text(e["error"], e["index"])}
            for e in job.get("errors") or []
        ]
        if job.get("error"):
            job["error"] = self.text(job["error"])
        return job


class EventReader:
    """The stream's events as the task's typed events, handed to the local printer."""

    def __init__(self, task: Task, names: Sources, printer: Callable[[Any], None]) -> None:
        self.task, self.names, self.printer = task, names, printer
        self.errors_shown: set[int] = set()

    def __call__(self, kind: str, data: dict) -> None:
        event = self.convert(kind, data)
        if event is not None:
            self.printer(event)

    def convert(self, kind: str, data: dict) -> Any:
        index = int(data.get("index", 0) or 0)
        if kind == "token":
            return ev.Token(data.get("text", ""), index)
        if kind == "partial":
            value = data.get("value")
            if isinstance(value, dict):
                tp = find_type(self.task.Result, set(value))
                value = from_json(tp, self.names.value(index, value)) if tp else value
            return ev.Partial(value, index)
        if kind == "step":
            return ev.Step(int(data["step"]), int(data["total"]), float(data.get("seconds", 0.0)))
        if kind == "progress":
            return ev.Progress(data.get("done", 0), data.get("total"), data.get("unit", "items"), data.get("label", ""))
        if kind == "item_error":
            self.errors_shown.add(index)
            source = self.names.source(index, str(data.get("source", data.get("input", ""))))
            message = self.names.text(str(data.get("message", data.get("error", ""))), index)
            return ev.ItemError(index, source, message)
        return None  # an event this client does not show (e.g. a newer server's)


# --------------------------------------------------------------------------- files made here


def attach_images(task: Task, rec, files: list[dict]) -> None:
    """The server's PNGs back into the images' pixels, so the local writer saves them (to -o or
    --out-dir, named as a local run names them, with the same settings in their text chunks)."""
    if task.writes_files != "png":
        return
    images = [im for gen in rec.results for im in getattr(gen, "images", [])]
    if len(files) != len(images):
        raise TaskError(
            f"the server sent {len(files)} file(s) for {len(images)} image(s); "
            f"use the same taskrun version on both sides"
        )
    import io

    import numpy as np
    from PIL import Image as PILImage

    for im, f in zip(images, files):
        with PILImage.open(io.BytesIO(base64.b64decode(f["data"]))) as png:
            im.pixels = np.asarray(png)
        im.files = []  # the server's names; the local writer names them here


def draw_annotations(task: Task, rec, inputs: list[Input]) -> None:
    """detect --annotate: the boxes drawn on the local copy of each image, named as a local run
    names them. A drawing that cannot be written fails that input only, as it does locally."""
    target = getattr(rec.options, "annotate", None)
    if task.name != "detect" or not target:
        return
    from taskrun.tasks.detect import annotate, annotation_path
    from taskrun.tasks.image_files import load_image

    failed = {e.index for e in rec.errors}
    several = len(inputs) - len(failed) > 1
    for item in sorted(rec.items, key=lambda i: i.index):
        position = item.index - sum(1 for f in failed if f < item.index)  # among the images that ran
        out = annotation_path(target, item.source, position, several)
        try:
            item.result.annotated = annotate(load_image(inputs[item.index].path), item.result, out)
        except (OSError, TaskError) as exc:
            rec.items.remove(item)
            rec.errors.append(ev.ItemError(item.index, item.source, f"cannot write the annotated image {out}: {exc}"))
