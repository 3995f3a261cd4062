"""What `run batch` tells the user while it runs and when it ends: a bar on a terminal (done/total,
items/s, ETA), a plain line every few seconds otherwise (a log file, CI), and the summary, on
stderr and as the batch's row in the run log."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import click

from taskrun.runner.output.writer import fmt_value

EVERY_S = 10.0  # seconds between plain progress lines


@dataclass
class TaskTally:
    items: int = 0
    failed: int = 0
    job_s: float = 0.0  # the wall time of this task's jobs, summed

    def rate(self) -> float:
        return self.items / self.job_s if self.job_s > 0 else 0.0


@dataclass
class Tally:
    """Counts of the batch so far."""

    total: int  # items to run in this invocation
    skipped: int  # already in the output
    ok: int = 0
    failed: int = 0
    tasks: dict[str, TaskTally] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)  # the first few (id, message)
    started: float = field(default_factory=time.perf_counter)
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="milliseconds"))

    def add(self, fin) -> int:
        bad = fin.failed()
        self.ok += len(fin.lines) - bad
        self.failed += bad
        t = self.tasks.setdefault(fin.task or "(no job)", TaskTally())
        t.items, t.failed, t.job_s = t.items + len(fin.lines), t.failed + bad, t.job_s + fin.wall_s
        for line in fin.lines:
            if len(self.errors) < 5 and _error_of(line):
                self.errors.append((line.get("custom_id") or line.get("id"), _error_of(line)))
        return len(fin.lines)

    @property
    def done(self) -> int:
        return self.ok + self.failed

    def wall_s(self) -> float:
        return time.perf_counter() - self.started


def _error_of(line: dict) -> str | None:
    if line.get("status") == "failed":
        return line.get("error")
    err = line.get("error")
    return err.get("message") if isinstance(err, dict) else None


class Progress:
    """Draws the tally as it grows: tqdm on a terminal, a plain line every EVERY_S otherwise."""

    def __init__(self, tally: Tally, *, quiet: bool) -> None:
        self.tally, self.quiet = tally, quiet
        self.bar = None
        self.last = time.perf_counter()
        if not quiet and (sys.stderr.isatty() or os.environ.get("TASKRUN_PROGRESS")) and tally.total:
            from tqdm import tqdm

            self.bar = tqdm(
                total=tally.total, unit="item", file=sys.stderr, smoothing=0.05, desc="batch", dynamic_ncols=True
            )

    def add(self, fin) -> None:
        n = self.tally.add(fin)
        if self.bar is not None:
            self.bar.update(n)
            if self.tally.failed:
                self.bar.set_postfix_str(f"{self.tally.failed} failed")
        elif not self.quiet and time.perf_counter() - self.last >= EVERY_S:
            self.last = time.perf_counter()
            click.echo(self.line(), err=True)

    def line(self) -> str:
        t = self.tally
        wall = t.wall_s()
        rate = t.done / wall if wall > 0 else 0.0
        eta = (t.total - t.done) / rate if rate > 0 else None
        pct = 100.0 * t.done / t.total if t.total else 100.0
        return (
            f"batch: {t.done}/{t.total} ({pct:.1f}%)  {t.failed} failed  {rate:.1f} items/s  "
            f"elapsed {wall:.0f} s" + (f"  eta {eta:.0f} s" if eta is not None else "")
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def summary_row(tally: Tally, batch_id: str, output: str, engine: str, source: str) -> dict:
    """The batch's own row in the run log (task "batch"), linked to its jobs' rows by chain_id."""
    wall = tally.wall_s()
    status = "ok" if not tally.failed else "partial" if tally.ok else "failed"
    per_task = {
        name: {"items": t.items, "failed": t.failed, "job_s": round(t.job_s, 3), "items_per_s": round(t.rate(), 2)}
        for name, t in tally.tasks.items()
    }
    return {
        "id": batch_id,
        "started_at": tally.started_at,
        "task": "batch",
        "status": status,
        "error": None if not tally.failed else f"{tally.failed} of {tally.done} items failed",
        "inputs": tally.done,
        "chain_id": batch_id,
        "summary": f"{tally.ok} ok, {tally.failed} failed, {tally.skipped} skipped → {output}",
        "options": {"input": source, "output": output, "engine": engine},
        "metrics": {
            "wall_s": round(wall, 4),
            "ok": tally.ok,
            "failed": tally.failed,
            "skipped": tally.skipped,
            "items_per_s": round(tally.done / wall, 2) if wall else 0.0,
            "tasks": per_task,
            "output": output,
        },
    }


def summary_text(tally: Tally, batch_id: str, output: str) -> str:
    wall = tally.wall_s()
    lines = [
        (
            f"batch {batch_id}: {tally.ok} ok, {tally.failed} failed, {tally.skipped} skipped "
            f"(already in the output) in {fmt_value(wall)} s → {output}"
        )
    ]
    for name, t in sorted(tally.tasks.items()):
        rate = f"{fmt_value(t.rate())} items/s in its jobs ({fmt_value(t.job_s)} s)" if t.job_s else "no job ran"
        lines.append(f"  {name:<11} {t.items} items, {t.failed} failed, {rate}")
    for item_id, message in tally.errors:
        lines.append(f"  error {item_id}: {message}")
    if tally.failed > len(tally.errors):
        lines.append(f"  … {tally.failed - len(tally.errors)} more failed (their lines say why)")
    lines.append(f"  jobs in the run log: run logs --chain {batch_id}")
    return "\n".join(lines)
