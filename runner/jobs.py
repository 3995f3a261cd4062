"""Running one job: resolve → check → load → run → log. Every front door (CLI, chains, server,
batch, the Python API) uses this: shared so that a job gives the same checks, metrics and log row
through any door. ``run_spec`` runs a job described as data (tasks/wire/jobspec.py).

The job's clock starts first, so ``wall_s`` is the whole job as the user waits; ``load_s`` is
resolution plus reading weights (close to 0 when the model is cached in-process).
"""

from __future__ import annotations

import contextlib
import hashlib
import resource
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from taskrun.runner.runlog.rows import job_texts, log_row, start_row
from taskrun.runner.signals import Terminated
from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, ModelCard, Task, TaskError, to_jsonable
from taskrun.tasks.clock import Clock

if TYPE_CHECKING:
    from taskrun.tasks.wire.jobspec import JobSpec


@dataclass
class JobRecord:
    """A finished (or failed) job: what ran, on what, with what result and numbers."""

    id: str
    task: str
    started_at: str
    options: Any = None
    card: ModelCard | None = None
    runtime: str | None = None
    device: str | None = None
    dtype: str | None = None
    items: list[ev.Item] = field(default_factory=list)
    errors: list[ev.ItemError] = field(default_factory=list)
    metrics: Any = None  # the task's Metrics
    load_s: float = 0.0
    wall_s: float = 0.0
    peak_rss_mb: float = 0.0
    status: str = "running"  # ok | partial (some items failed) | failed
    error: str | None = None
    input_digest: str | None = None
    n_inputs: int = 0
    chain_id: str | None = None
    stage: int | None = None
    notes: list[str] = field(default_factory=list)  # the job's Notices: a model switched, a cache rebuilt
    texts: list[tuple[int, str, str]] = field(default_factory=list, repr=False)  # (item, role, text) to log
    incomplete: int = 0  # items whose result is partial (a recording cut short): status partial

    @property
    def results(self) -> list[Any]:
        return [it.result for it in sorted(self.items, key=lambda i: i.index)]

    @property
    def partial_not_accepted(self) -> int:
        """Partial results the user did not accept with --allow-partial: the command exits 1."""
        return 0 if getattr(self.options, "allow_partial", False) else self.incomplete

    def common_metrics(self) -> dict:
        return {
            "load_s": round(self.load_s, 4),
            "wall_s": round(self.wall_s, 4),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
        }

    def metrics_dict(self) -> dict:
        return {**self.common_metrics(), **(to_jsonable(self.metrics) or {})}

    def to_json(self) -> dict:
        card = self.card
        return {
            "id": self.id,
            "task": self.task,
            "status": self.status,
            "error": self.error,
            "model": None
            if card is None
            else {
                "name": card.name,
                "path": card.path,
                "digest": card.digest,
                "architecture": card.architecture,
                "source": card.source,
            },
            "runtime": self.runtime,
            "device": self.device,
            "dtype": self.dtype,
            "options": to_jsonable(self.options),
            "items": [
                {"index": it.index, "input": it.source, "result": to_jsonable(it.result)}
                for it in sorted(self.items, key=lambda i: i.index)
            ],
            "errors": [{"index": e.index, "input": e.source, "error": e.message} for e in self.errors],
            "metrics": self.metrics_dict(),
            "notes": list(self.notes),
            **({"chain_id": self.chain_id, "stage": self.stage} if self.chain_id else {}),
        }


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB). A process-wide high-water mark."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 1024 / 1024


def input_digest(inputs: list[Input]) -> str:
    h = hashlib.sha256()
    for inp in inputs:
        if inp.text is not None:
            h.update(inp.text.encode())
        elif inp.path:
            with open(inp.path, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def new_id() -> str:
    # Time-ordered and unique across processes: sortable in `run logs`, safe under concurrency.
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


def run_job(
    task: Task,
    get_inputs: Callable[[], list[Input]],
    options: Any | Callable[[], Any],
    *,
    model: str | None = None,
    runtime: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    offline: bool = False,
    log=None,
    on_event: Callable[[Any], None] | None = None,
    chain_id: str | None = None,
    stage: int | None = None,
) -> JobRecord:
    """Run one job to the end and log it.

    Raises TaskError (after logging) when the job cannot run, or when its only input fails (with
    that input's message). A batch runs to the end: each failed input is an ``ItemError`` in the
    record, whose status is ``partial`` when some inputs succeeded and ``failed`` when none did.
    """
    clock = Clock()
    rec = JobRecord(
        id=new_id(),
        task=task.name,
        chain_id=chain_id,
        stage=stage,
        started_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
    )
    emit = on_event or (lambda e: None)
    inputs: list[Input] = []
    if log is not None:  # the row of a job that is killed from here on: `run logs` shows it interrupted
        log.append(start_row(rec, model))
    try:
        rec.options = options() if callable(options) else options
        inputs = _inputs(task, get_inputs, rec)
        _run(task, inputs, rec, clock, emit, model=model, runtime=runtime, device=device, dtype=dtype, offline=offline)
        rec.status, rec.error = _outcome(rec)
    except TaskError as exc:
        rec.status, rec.error = "failed", str(exc)
        raise
    except KeyboardInterrupt as exc:
        rec.status = "interrupted"
        rec.error = "interrupted by SIGTERM" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
        raise
    except BrokenPipeError:  # the reader of stdout left (`| head -1`): not the job's failure
        rec.status, rec.error = _outcome(rec) if _all_done(rec) else ("interrupted", PIPE_CLOSED)
        raise
    except Exception as exc:
        rec.status, rec.error = "failed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        rec.wall_s = clock.now()
        rec.peak_rss_mb = peak_rss_mb()
        if log is not None:
            rec.texts = job_texts(task, inputs, rec)
            log.append(log_row(rec))
    return rec


PIPE_CLOSED = "stopped: the reader of its output closed the pipe"


def _inputs(task: Task, get_inputs: Callable[[], list[Input]], rec: JobRecord) -> list[Input]:
    """The job's inputs, checked against what the task takes, and counted and digested in ``rec``."""
    inputs = get_inputs()
    if not inputs and task.inputs_required:
        raise TaskError(f"no input given; {task.name} takes {task.takes}")
    if len(inputs) > 1 and not task.batch:
        raise TaskError(f"{task.name} takes one input per job, got {len(inputs)}; run it once for each")
    rec.n_inputs = len(inputs)
    rec.input_digest = input_digest(inputs)
    return inputs


def _all_done(rec: JobRecord) -> bool:
    return rec.n_inputs > 0 and len(rec.items) + len(rec.errors) >= rec.n_inputs


def _run(
    task: Task, inputs: list[Input], rec: JobRecord, clock: Clock, emit, *, model, runtime, device, dtype, offline
) -> None:
    from taskrun.models.resolve import default_model, resolve
    from taskrun.pipelines import load_pipeline

    good: list[tuple[int, Input]] = []
    for i, inp in enumerate(inputs):
        try:
            task.check_input(inp)
            good.append((i, inp))
        except TaskError as exc:
            _item_failed(rec, ev.ItemError(i, inp.describe(), str(exc)), emit)
    if not good and inputs:  # nothing to load a model for
        raise TaskError(f"none of the {len(inputs)} inputs could be used; see the errors above")

    t_load = time.perf_counter()
    first_kind = good[0][1].kind if good else None
    card = resolve(model or default_model(task.name, first_kind), offline=offline)
    card = _second_look(
        task,
        card,
        [inp for _, inp in good],
        rec,
        emit,
        chosen=model is not None,
        runtime=runtime,
        device=device,
        dtype=dtype,
        offline=offline,
    )
    rec.card = card
    task.check([inp for _, inp in good], rec.options, card)
    rec.runtime = runtime or card.runtime
    pipe = load_pipeline(task.name, card, rec.runtime, device, dtype)
    rec.load_s = time.perf_counter() - t_load
    rec.device, rec.dtype = pipe.device, pipe.dtype

    index = [i for i, _ in good]
    events = _guarded(pipe.run([inp for _, inp in good], rec.options, clock))
    with contextlib.closing(events):  # a lone failed input ends the job here: stop the pipeline
        for event in events:
            if isinstance(event, (ev.Item, ev.ItemError, ev.Token, ev.Partial)):
                event = _reindex(event, index)
            if isinstance(event, ev.ItemError):
                _item_failed(rec, event, emit)
                continue
            if isinstance(event, ev.Notice):
                rec.notes.append(event.message)
                rec.incomplete += bool(getattr(event, "partial", False))
            if isinstance(event, ev.Item):
                rec.items.append(event)
            elif isinstance(event, ev.Done):
                rec.metrics = event.metrics
            emit(event)
    if rec.metrics is None:
        raise RuntimeError(f"the {rec.runtime} pipeline for {task.name} ended without its metrics")


def _second_look(task: Task, card: ModelCard, inputs: list[Input], rec: JobRecord, emit, **kw) -> ModelCard:
    """The card to load: a pipeline with an ``advise_model`` hook may look at the inputs first and
    advise another model (transcribe: a multilingual one for speech that is not English, when the
    user named none) or warn. The job runs and logs the advised model; the advice is a Notice."""
    from taskrun.pipelines import RUNTIMES, load_symbol

    row = RUNTIMES.get((task.name, kw["runtime"] or card.runtime))
    advise = getattr(load_symbol(row.pipeline), "advise_model", None) if row else None
    if advise is None:
        return card
    card, notes = advise(card, inputs, rec.options, **kw)
    for note in notes:
        rec.notes.append(note)
        emit(ev.Notice(note))
    return card


def _item_failed(rec: JobRecord, err: ev.ItemError, emit) -> None:
    """The one failure policy for an input, whether its check or the pipeline failed it: a job
    of one input fails with that input's message; in a batch it is reported and the rest go on."""
    if rec.n_inputs == 1:
        raise TaskError(err.describe())
    rec.errors.append(err)
    emit(err)


def _outcome(rec: JobRecord) -> tuple[str, str | None]:
    """(status, error) of a job that ran to the end: failed when none of its inputs succeeded."""
    if not rec.errors:
        return ("partial" if rec.incomplete else "ok"), None
    if rec.items:
        return "partial", None
    return "failed", f"{len(rec.errors)} of {rec.n_inputs} inputs failed"


def _guarded(gen):
    """Run the pipeline under torch's inference mode when torch is in use: a torch pipeline has
    imported it by now, loading its weights. One that runs on CTranslate2, ONNX Runtime or
    llama.cpp has not, and importing it here only for this cost every such job ~2 s (a cold
    transcription of the meeting: 4.2 s, against faster-whisper's 2.2 s)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield from gen
        return
    with torch.inference_mode():
        yield from gen


def _reindex(event, index: list[int]):
    import dataclasses

    return dataclasses.replace(event, index=index[event.index]) if event.index < len(index) else event


def run_spec(
    spec: JobSpec,
    *,
    log=None,
    on_event: Callable[[Any], None] | None = None,
    device: str = "auto",
    dtype: str = "auto",
    offline: bool = False,
):
    """Run a JobSpec through ``run_job`` (checks, model cache, run log, metrics) → JobRecord."""
    from taskrun.runner.inputs import options_from
    from taskrun.tasks import get_task

    task = get_task(spec.task)
    return run_job(
        task,
        lambda: list(spec.inputs),
        lambda: options_from(task, _cli_values(task, spec.options)),
        model=spec.model,
        runtime=spec.runtime,
        device=device,
        dtype=dtype,
        offline=offline,
        log=log,
        on_event=on_event,
    )


def _cli_values(task, options: dict[str, Any]) -> dict[str, Any]:
    """JSON option values → the types the Options dataclass holds (lists become tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
