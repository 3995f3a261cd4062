"""``run``, ``stream``, ``load`` and ``tasks``: Python values → one job through ``run_job``.

Inputs mean what the CLI's arguments mean (``runner.inputs.gather_inputs``): a text, a path to a
file or folder (a ``str`` that names an existing file, or a ``pathlib.Path``), or a list of them.
Options are the task's Options field names (``run tasks --json`` lists them) with the same
checks; an unknown one is a TaskError naming the known ones. Every call is one run-log row.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from taskrun.runner.api.results import results_of
from taskrun.runner.api.stream import Stream
from taskrun.runner.inputs import gather_inputs, options_from
from taskrun.runner.jobs import JobRecord, run_job
from taskrun.runner.runlog.store import RunLog
from taskrun.tasks import get_task
from taskrun.tasks.base import Input, Task, TaskError


def run(
    task: str,
    input: Any,
    *,
    model: str | None = None,
    runtime: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    offline: bool = False,
    log_db: str | os.PathLike | None = None,
    **options: Any,
) -> Any:
    """Run ``task`` on ``input`` and return its typed result (for a list or a folder, a Results
    list), each with ``.run_id``, ``.metrics`` and ``.job``. Raises TaskError naming the fix."""
    t = get_task(task)
    rec = _job(t, input, model, runtime, device, dtype, offline, log_db, options, None)
    return results_of(rec, _single(input))


def stream(
    task: str,
    input: Any,
    *,
    model: str | None = None,
    runtime: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    offline: bool = False,
    log_db: str | os.PathLike | None = None,
    **options: Any,
) -> Stream:
    """As ``run``, but an iterator of the job's events as they happen (tokens, transcript
    segments, image steps...); its ``.result`` is ``run``'s return value once it is exhausted."""
    t = get_task(task)
    return Stream(
        lambda on_event: _job(t, input, model, runtime, device, dtype, offline, log_db, options, on_event),
        lambda rec: results_of(rec, _single(input)),
    )


def tasks() -> list[dict]:
    """What ``run tasks --json`` lists: each task's inputs, options, results, metrics, formats."""
    from taskrun.models.resolve import task_catalogue

    return task_catalogue()


class Model:
    """A model loaded for one task and kept warm: ``run`` and ``stream`` as the module functions,
    on this model, without loading it again (``metrics.load_s`` is resolution only)."""

    def __init__(self, task: str, model: str | None = None, *, runtime=None, device="auto", dtype="auto", **kw):
        from taskrun.models.resolve import default_model, resolve
        from taskrun.pipelines import load_pipeline

        self.task = get_task(task)
        self._kw = {
            "device": device,
            "dtype": dtype,
            "offline": kw.pop("offline", False),
            "log_db": kw.pop("log_db", None),
        }
        kind = kw.pop("input_kind", None)
        if kw:
            raise TaskError(
                f"load() takes model, runtime, device, dtype, offline, log_db, input_kind; not {', '.join(kw)}"
            )
        self.card = resolve(model or default_model(task, kind), offline=self._kw["offline"])
        self.runtime = runtime or self.card.runtime
        # Reading the weights now puts them in the in-process model cache, where every job on
        # this model finds them; the pipeline held here keeps them alive as long as the handle.
        self._pipeline = load_pipeline(task, self.card, self.runtime, device, dtype)
        self.device, self.dtype = self._pipeline.device, self._pipeline.dtype

    def run(self, input: Any, **options: Any) -> Any:
        """``taskrun.run`` on this model."""
        return run(self.task.name, input, model=self.card.name, runtime=self.runtime, **self._kw, **options)

    def stream(self, input: Any, **options: Any) -> Stream:
        """``taskrun.stream`` on this model."""
        return stream(self.task.name, input, model=self.card.name, runtime=self.runtime, **self._kw, **options)

    def close(self) -> None:
        """Unload the model's weights from this process."""
        from taskrun.pipelines import unload

        self._pipeline = None
        unload(self.card.digest)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<taskrun.Model {self.task.name} {self.card.name} on {self.runtime}/{self.device}/{self.dtype}>"


def load(task: str, model: str | None = None, **kw: Any) -> Model:
    """Load ``model`` (the task's default when None) for ``task`` and keep it warm: a handle
    with ``.run()`` and ``.stream()``. Keywords: runtime, device, dtype, offline, log_db, and
    input_kind (``"text"`` picks classify's default model for texts, not images)."""
    return Model(task, model, **kw)


# --------------------------------------------------------------------------- one job


def _job(task: Task, input, model, runtime, device, dtype, offline, log_db, options, on_event) -> JobRecord:
    return run_job(
        task,
        lambda: _inputs(task, input),
        lambda: options_from(task, {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}),
        model=model,
        runtime=runtime,
        device=device,
        dtype=dtype,
        offline=offline,
        log=RunLog(log_db),
        on_event=on_event,
    )


def _single(input: Any) -> bool:
    return isinstance(input, (str, os.PathLike))


def _inputs(task: Task, input: Any) -> list[Input]:
    """The inputs of a call, read as the CLI reads its arguments (never stdin)."""
    items = [input] if _single(input) else input
    if isinstance(items, (bytes, bytearray)) or not hasattr(items, "__iter__"):
        raise TaskError(_what(task, input))
    args = []
    for i, item in enumerate(items, 1):
        if isinstance(item, os.PathLike):
            if not Path(item).exists():
                raise TaskError(f"{item}: no such file; {task.name} takes {task.takes}")
            args.append(os.fspath(item))
        elif isinstance(item, str):
            args.append(item)
        else:
            raise TaskError(f"input {i}: {_what(task, item)}")
    return gather_inputs(task, tuple(args), ()) if args else []


def _what(task: Task, value: Any) -> str:
    return (
        f"a {type(value).__name__} is not an input; {task.name} takes {task.takes}: pass a text, "
        f"a path (str or pathlib.Path), or a list of them"
    )
