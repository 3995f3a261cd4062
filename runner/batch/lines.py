"""The lines `run batch` writes, one per input item, and the side files some tasks make.

A taskrun line: ``{"id", "task", "status": "ok"|"failed", "result", "error", "metrics", "model",
"run_id"}``. ``result`` is the item's result exactly as ``run TASK --json`` gives it (a list of
them when the line's ``input`` was a list). ``metrics`` are those of the job that ran the item:
its own for tasks run one item per job (transcribe, generate, summarize, image); for tasks batched
across items (embed, classify, detect, search) the job's, shared by the ``job_items`` items it ran
together. ``run_id`` is that job's row in the run log (`run logs show RUN_ID`).

An OpenAI line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}`` as OpenAI's Batch API writes it, the body being what the server answers to the same
request (one parser and one answer-writer: tasks/wire/openai_api.py). ``request_id`` is the run
id. A failed request has its status code and ``{"error": {...}}`` body, and ``error`` set too.

The key order is fixed: journal.py reads the id and outcome from each line's start on resume.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskrun.tasks.base import TaskError, to_jsonable


@dataclass
class Failure:
    """Why an item has no result: the message (which names the fix), and for OpenAI lines the
    HTTP status and error fields the server would answer with."""

    message: str
    status: int = 400
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        """From an APIError (the OpenAI parser's), a TaskError (400/404 as the server answers
        it) or anything else (500: a bug, named by its type)."""
        if isinstance(exc, TaskError):
            from taskrun.tasks.wire.errors import from_task_error

            exc = from_task_error(exc)
        if hasattr(exc, "status") and hasattr(exc, "body"):
            return cls(exc.message, exc.status, exc.type, exc.param, exc.code)
        return cls(
            f"internal error: {type(exc).__name__}: {exc} (set TASKRUN_DEBUG=1 to see the traceback)",
            500,
            "server_error",
        )

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def model_of(rec, row: dict | None) -> dict | None:
    """The model that ran (or was resolved before the job failed): name and digest."""
    if rec is not None and rec.card is not None:
        return {"name": rec.card.name, "digest": rec.card.digest}
    if row and row.get("model"):
        return {"name": row["model"], "digest": row.get("model_digest")}
    return None


def cli_result(result: Any) -> Any:
    """A result as ``run TASK --json`` prints it: the record's ``to_jsonable``, then the
    printer's, which rounds the floats the first made of numpy arrays (vectors) to 6 decimals.

    The second pass meets plain JSON values only, where ``to_jsonable`` reduces to rounding the
    floats; ``_rounded`` does just that, ~3x faster on vectors (the generic pass took 4.6 s of a
    24 s batch of 2,000 embeddings)."""
    return _rounded(to_jsonable(result))


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {str(k): _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [round(v, 6) if type(v) is float else _rounded(v) for v in obj]
    return obj


def native_line(
    item_id: str,
    task: str,
    *,
    result: Any = None,
    failure: Failure | None = None,
    metrics: dict | None = None,
    model: dict | None = None,
    run_id: str | None = None,
    files: list[str] | None = None,
) -> dict:
    line = {
        "id": item_id,
        "task": task,
        "status": "failed" if failure else "ok",
        "result": cli_result(result),
        "error": failure.message if failure else None,
        "metrics": metrics,
        "model": model,
        "run_id": run_id,
    }
    if files:
        line["files"] = files
    return line


def openai_line(custom_id: str, *, body: Any = None, failure: Failure | None = None, run_id: str | None = None) -> dict:
    status = failure.status if failure else 200
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": run_id, "body": failure.body() if failure else body},
        "error": {"code": failure.code or failure.type, "message": failure.message} if failure else None,
    }


# --------------------------------------------------------------------------- side files


def side_path(out_dir: str | Path, item_id: str, suffix: str) -> Path:
    """Where an item's side file goes: its id as a relative path under ``out_dir`` (a folder's
    layout is kept: ``sub/a.wav`` → ``OUT/sub/a.wav.srt``), never outside it; ids that sanitise
    alike (``..``, ``.``) get distinct names, a very long id a shortened one (runner/output/safe.py)."""
    from taskrun.runner.output.safe import file_name

    return file_name(out_dir, item_id, suffix)


def write_side_files(task, item_id: str, result: Any, options: Any, out_dir: str | None) -> list[str]:
    """An item's files, written before its line (a line in the output means its files exist):
    the SRT of a transcript, the PNGs of an image job (without ``out_dir`` they go where the
    job's own ``out_dir`` option says, as ``run image`` puts them). Written whole or not at all."""
    from taskrun.runner.output.safe import write_file

    if task.name == "image" and not out_dir:  # as `run image --json`: named from prompt and seed
        from taskrun.tasks.image import save

        return save(result, None, options.out_dir)
    if not out_dir:
        return []
    if task.name == "transcribe":
        path = side_path(out_dir, item_id, ".srt")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, task.write([result], "srt", path, options), what="--out-dir file")
        if not getattr(options, "speakers", False):
            return [str(path)]
        rttm = side_path(out_dir, item_id, ".rttm")  # who spoke when, for diarization tools
        write_file(rttm, task.write([result], "rttm", rttm, options), what="--out-dir file")
        return [str(path), str(rttm)]
    if task.name == "image":
        from taskrun.tasks.image import save

        path = side_path(out_dir, item_id, ".png")
        path.parent.mkdir(parents=True, exist_ok=True)
        return save(result, path, str(path.parent))
    return []
