"""What a Python call returns: the task's own typed results (a Generation, a Transcript, an
Embedding, ...), each given its job's ``run_id``, ``metrics`` and ``job`` (model, digest,
runtime, device, dtype, options), as the CLI's ``--json`` and the run log show them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taskrun.runner.jobs import JobRecord
from taskrun.tasks.base import TaskError


class RunMetrics:
    """A job's numbers as attributes: ``load_s``, ``wall_s``, ``peak_rss_mb`` (every job) and the
    task's own metrics (``output_tokens``, ``rtf``, ``items_per_s``...); ``task`` is the task's
    Metrics dataclass itself, ``to_dict()`` all of them as ``--json`` prints them."""

    def __init__(self, values: dict[str, Any], task: Any) -> None:
        self.__dict__["_values"] = dict(values)
        self.__dict__["task"] = task

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            known = ", ".join(self.__dict__["_values"])
            raise AttributeError(f"no metric named {name!r}; this job measured: {known}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a job's metrics are read-only")

    def __dir__(self) -> list[str]:
        return [*self.__dict__["_values"], "task", "to_dict"]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__["_values"])

    def __repr__(self) -> str:
        return "RunMetrics(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__["_values"].items()) + ")"


@dataclass(frozen=True)
class JobInfo:
    """What ran: the facts of the job's run-log row (``run logs show RUN_ID``)."""

    run_id: str
    task: str
    status: str  # ok | partial
    model: str | None
    digest: str | None
    runtime: str | None
    device: str | None
    dtype: str | None
    options: Any  # the task's Options, checked
    notes: tuple[str, ...] = ()  # a model switched for the speech's language, a cache rebuilt
    errors: tuple[tuple[str, str], ...] = ()  # (input, message) of each input that failed

    @classmethod
    def of(cls, rec: JobRecord) -> JobInfo:
        return cls(
            run_id=rec.id,
            task=rec.task,
            status=rec.status,
            model=rec.card.name if rec.card else None,
            digest=rec.card.digest if rec.card else None,
            runtime=rec.runtime,
            device=rec.device,
            dtype=rec.dtype,
            options=rec.options,
            notes=tuple(rec.notes),
            errors=tuple((e.source, e.message) for e in rec.errors),
        )


class Results(list):
    """The results of a job of several inputs (a list of texts, a folder), in input order, with
    the job's ``run_id``, ``metrics`` and ``job``."""

    def __init__(self, items: list[Any], run_id: str, metrics: RunMetrics, job: JobInfo) -> None:
        super().__init__(items)
        self.run_id, self.metrics, self.job = run_id, metrics, job


class UnfinishedJob(TaskError):
    """Some inputs failed, or a result is partial and was not accepted: the message says which and
    what to do; ``results`` holds everything that did finish (nothing is lost)."""

    def __init__(self, message: str, results: Results) -> None:
        super().__init__(message)
        self.results = results


def results_of(rec: JobRecord, single: bool) -> Any:
    """The call's return value: the one result for one input, else Results; UnfinishedJob when
    an input failed or a partial result was not accepted (``allow_partial=True`` accepts it)."""
    metrics = RunMetrics(rec.metrics_dict(), rec.metrics)
    job = JobInfo.of(rec)
    items = []
    for result in rec.results:
        for name, value in (("run_id", rec.id), ("metrics", metrics), ("job", job)):
            object.__setattr__(result, name, value)  # frozen result dataclasses too
        items.append(result)
    out = Results(items, rec.id, metrics, job)
    if rec.errors:
        first = rec.errors[0]
        raise UnfinishedJob(
            f"{len(rec.errors)} of {rec.n_inputs} inputs failed (first: {first.describe()}); "
            f"the others finished: their results are on this error's .results",
            out,
        )
    if rec.partial_not_accepted:
        raise UnfinishedJob(
            f"{rec.partial_not_accepted} result(s) are partial ({'; '.join(rec.notes)}); "
            f"pass allow_partial=True to accept them, or see this error's .results",
            out,
        )
    return items[0] if single and len(items) == 1 else out
