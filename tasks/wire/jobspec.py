"""A job described as data: the one shape every programmatic front door turns its requests into.

The server's endpoints (OpenAI, Ollama, native ``/v1/tasks/{task}``), ``run batch``'s JSONL lines
and the CLI's ``--server`` mode all build a :class:`JobSpec` and run it with ``runner.jobs.run_spec``, so
each request format has one parser and every job goes through ``run_job`` (checks, run log,
metrics) exactly as a command-line job does.

Inputs are texts, or bytes the client sent (written to a private temporary folder and sniffed
from their content, as the CLI sniffs files). A path on this machine's disk is accepted only when
the caller says so (``allow_paths``: ``run batch`` on the operator's own files); a server never
lets a client name one.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrun.tasks import get_task
from taskrun.tasks.base import Input, TaskError
from taskrun.tasks.inputs import file_input, is_path, text_input


@dataclass
class JobSpec:
    """One job: which task, on which inputs, with which option values (the task's Options field
    names, as ``run tasks`` lists them), on which model."""

    task: str
    inputs: list[Input]
    options: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    runtime: str | None = None
    id: str | None = None  # the caller's id (custom_id, a batch line's id), if it has one


class Uploads:
    """A private temporary folder for the bytes of one request; removed with everything in it on
    ``close``. Use as a context manager around the job."""

    def __init__(self) -> None:
        # The pid in the name: a server that starts sweeps the folders of dead ones (kill -9).
        self.dir = Path(tempfile.mkdtemp(prefix=f"taskrun-upload-{os.getpid()}-"))
        os.chmod(self.dir, 0o700)
        self._n = 0

    def add(self, data: bytes, name: str = "") -> Input:
        """An Input for uploaded bytes: kept under a safe name, its kind sniffed from the content."""
        if not data:
            raise TaskError(f"upload {name or self._n + 1} is empty (0 bytes)")
        self._n += 1
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name or "upload").name)[:80].lstrip(".") or "upload"
        path = self.dir / f"{self._n:04d}-{safe}"
        path.write_bytes(data)
        inp = file_input(path)
        # Report the name the client gave, never the server's temporary path.
        return Input(source=name or f"upload {self._n}", kind=inp.kind, text=inp.text, path=inp.path)

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def decode_base64(value: str, what: str) -> bytes:
    """Bytes from base64 or a ``data:<mime>;base64,`` URL; a clear error otherwise."""
    if value.startswith("data:"):
        _, _, value = value.partition(",")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise TaskError(f"{what} is not valid base64; send the file's bytes base64-encoded") from None


def native_inputs(value: Any, *, uploads: Uploads | None, allow_paths: bool) -> list[Input]:
    """The ``input`` of a native job: a text, a list of texts, or items ``{"text": ...}``,
    ``{"data": <base64>, "name": ...}`` (bytes), or ``{"path": ...}`` (only with ``allow_paths``).
    A plain string is a path only where paths are allowed and the file exists."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    out: list[Input] = []
    for i, item in enumerate(items, 1):
        where = f"input {i}" if len(items) > 1 else "input"
        if isinstance(item, str):
            if allow_paths and is_path(item):
                out.append(file_input(item))
            else:
                out.append(text_input(item, where))
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            out.append(text_input(item["text"], where))
        elif isinstance(item, dict) and isinstance(item.get("data"), str):
            if uploads is None:
                raise TaskError(f"{where}: inline data is not accepted here")
            out.append(uploads.add(decode_base64(item["data"], where), str(item.get("name") or "")))
        elif isinstance(item, dict) and isinstance(item.get("path"), str):
            if not allow_paths:
                raise TaskError(
                    f"{where}: a path on the server's disk is not accepted; send the "
                    f'file\'s bytes as {{"data": <base64>, "name": "..."}}'
                )
            out.append(file_input(item["path"]))
        else:
            raise TaskError(
                f'{where} must be a text, {{"text": ...}} or {{"data": <base64>, "name": ...}}'
                + (' or {"path": ...}' if allow_paths else "")
            )
    return out


def job_from_native(task: str, body: dict, *, uploads: Uploads | None = None, allow_paths: bool = False) -> JobSpec:
    """A native job ``{"input": ..., "options": {...}, "model": ..., "runtime": ...}`` for ``task``
    (the body of ``POST /v1/tasks/{task}``, and a taskrun-format ``run batch`` line)."""
    get_task(task)  # an unknown task is named before anything else
    if not isinstance(body, dict):
        raise TaskError("the job must be a JSON object")
    known = {"input", "options", "model", "runtime", "id", "task"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise TaskError(
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"a job takes: {', '.join(sorted(known))}"
        )
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise TaskError('"options" must be an object of option names and values (see `run tasks`)')
    if not allow_paths:
        named = sorted(set(options) & path_options(task))
        if named:
            raise TaskError(
                f"option {named[0]} names a path on the server's disk, which a client "
                f"may not do; see the server's docs for how to send it"
            )
    for key in ("model", "runtime"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise TaskError(f'"{key}" must be a string')
    return JobSpec(
        task=task,
        inputs=native_inputs(body.get("input"), uploads=uploads, allow_paths=allow_paths),
        options=dict(options),
        model=body.get("model"),
        runtime=body.get("runtime"),
        id=None if body.get("id") is None else str(body["id"]),
    )


def path_options(task: str) -> set[str]:
    """The task's options whose values name files or folders (``option(..., path=True)``)."""
    import dataclasses

    return {f.name for f in dataclasses.fields(get_task(task).Options) if f.metadata.get("path")}
