"""The shape of a job's rows in the run log: the row written as it starts, the row that
replaces it when it ends (model, digest, runtime, options, metrics, versions, outcome), and the
texts kept beside it. ``rec`` is a runner.jobs.JobRecord.
"""

from __future__ import annotations

import functools
from typing import Any

from taskrun.tasks.base import Input, Task, to_jsonable

# The tasks whose texts the run log keeps (prompt and answer, text and summary, the transcript);
# `run chat` runs generate jobs. Other tasks' inputs are only digested.
TEXT_TASKS = frozenset({"generate", "summarize", "transcribe"})


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """Package versions for the run log; read once per process (importlib.metadata scans every
    installed distribution: ~50 ms a job on a busy machine, most of a warm server request)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("taskrun", "torch", "transformers", "diffusers", "faster-whisper"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def job_texts(task: Task, inputs: list[Input], rec: Any) -> list[tuple[int, str, str]]:
    """(item, "input" | "output", text) for the run log's text table: the prompts or texts given
    and the answers, summaries or transcripts made, for the tasks in TEXT_TASKS. Whether they are
    kept is the log's choice (`--no-log-text`)."""
    if task.name not in TEXT_TASKS:
        return []
    out = [(i, "input", inp.text) for i, inp in enumerate(inputs) if inp.kind == "text" and inp.text]
    for it in sorted(rec.items, key=lambda x: x.index):
        try:
            text = task.handoff(it.result) if task.produces else getattr(it.result, "text", None)
        except Exception:  # an odd result never costs the job its row
            text = None
        if isinstance(text, str) and text:
            out.append((it.index, "output", text))
    return out


def start_row(rec: Any, model: str | None = None) -> dict:
    """The row written as a job starts: enough to list it (the model as asked for, if named), and
    the process that runs it."""
    from taskrun.runner.runlog.liveness import stamp

    return {
        "id": rec.id,
        "started_at": rec.started_at,
        "task": rec.task,
        "status": "running",
        "model": model,
        "chain_id": rec.chain_id,
        "stage": rec.stage,
        **stamp(),
    }


def log_row(rec: Any) -> dict:
    from taskrun.runner.runlog.liveness import stamp

    card = rec.card
    return {
        **stamp(),
        "texts": rec.texts if rec.task in TEXT_TASKS else None,
        "id": rec.id,
        "started_at": rec.started_at,
        "task": rec.task,
        "model": card.name if card else None,
        "model_path": card.path if card else None,
        "model_digest": card.digest if card else None,
        "model_source": card.source if card else None,
        "runtime": rec.runtime,
        "device": rec.device,
        "dtype": rec.dtype,
        "options": to_jsonable(rec.options),
        "input_digest": rec.input_digest,
        "inputs": rec.n_inputs,
        "summary": summarize_items(rec),
        "metrics": rec.metrics_dict(),
        "versions": versions(),
        "status": rec.status,
        "error": rec.error,
        "chain_id": rec.chain_id,
        "stage": rec.stage,
        "notes": [*rec.notes, *(card.extra.get("ran", ()) if card else ())] or None,  # + a converted copy
    }


def summarize_items(rec: Any, limit: int = 300) -> str:
    """A short human summary of the results for `run logs`."""
    parts = []
    for it in sorted(rec.items, key=lambda i: i.index):
        s = getattr(it.result, "summary", None)
        parts.append(s() if callable(s) else str(to_jsonable(it.result))[:80])
    if rec.errors:
        parts.append(f"{len(rec.errors)} failed")
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"
