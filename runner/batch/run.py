"""One batch from start to end, for the command and for callers in Python: check the input, open
the output for resuming, run the engine, write the summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from taskrun.runner.batch.journal import Journal
from taskrun.runner.batch.progress import Progress, Tally, summary_row, summary_text
from taskrun.runner.batch.source import OPENAI, open_input
from taskrun.runner.batch.work import Context
from taskrun.runner.signals import held
from taskrun.tasks.base import TaskError


@dataclass
class Request:
    inputs: tuple[str, ...]
    output: str
    out_dir: str | None = None
    model: str | None = None
    runtime: str | None = None
    options: dict = field(default_factory=dict)
    restart: bool = False
    retry_failed: bool = False
    chunk: int = 256
    workers: str = "auto"
    engine: str = "local"
    ray_address: str | None = None
    actors: int = 1
    device: str = "auto"
    dtype: str = "auto"
    offline: bool = False
    log_db: str | None = None
    quiet: bool = False


@dataclass
class Outcome:
    batch_id: str
    ok: int
    failed: int  # this run's failures plus those already in the output
    skipped: int


def _check_paths(req: Request) -> None:
    from taskrun.runner.output.safe import same_file

    # By inode, not by name: a hard link or symlink to the input is the input (--restart would empty it).
    out = Path(req.output).resolve()
    if any(Path(p).exists() and (Path(p).resolve() == out or same_file(p, out)) for p in req.inputs):
        raise TaskError(f"-o {req.output} is the input itself (the same file); name another output file")
    if req.out_dir and not Path(req.out_dir).is_dir():
        raise TaskError(f"--out-dir {req.out_dir} does not exist; create it first")


def run_batch(req: Request, *, workers_of: Callable[[str, dict], int]) -> Outcome:
    from taskrun.runner.jobs import new_id
    from taskrun.runner.runlog.store import RunLog

    _check_paths(req)
    source = open_input(req.inputs)
    scan = source.scan()  # structure, formats, unique ids: before anything loads
    if req.options and scan.flavour == OPENAI:
        raise TaskError("-O sets taskrun job options; OpenAI requests carry theirs in their bodies")
    workers = workers_of(req.workers, scan.tasks) if req.engine == "local" else 1
    log = RunLog(req.log_db)
    ctx = Context(
        batch_id=new_id(),
        device=req.device,
        dtype=req.dtype,
        offline=req.offline,
        out_dir=req.out_dir,
        model=req.model,
        runtime=req.runtime,
        options=req.options,
        chunk=req.chunk,
    )
    with Journal(req.output, flavour=scan.flavour, restart=req.restart, retry_failed=req.retry_failed) as journal:
        done = journal.done
        skipped = len(scan.ids & done.keys())
        earlier_failed = sum(1 for i in scan.ids if done.get(i) is False)
        scan.ids = set()
        if journal.damaged and not req.quiet:
            count, first, side = journal.damaged
            shown = ", ".join(map(str, first)) + (", ..." if count > len(first) else "")
            click.echo(
                f"resuming: {count} damaged line(s) of {req.output} (line {shown}; "
                f"{journal.dropped_bytes} bytes) moved to {side}; their items run again",
                err=True,
            )
        tally = Tally(total=scan.total - skipped, skipped=skipped)
        progress = Progress(tally, quiet=req.quiet)

        def write(fin) -> None:
            # Written and counted together: a SIGTERM or Ctrl-C between the two made the summary's
            # counts disagree with the lines on disk (issue 33); it is acted on once both are done.
            with held():
                journal.write(fin.lines)
                progress.add(fin)

        pending = (e for e in source.entries() if e.id not in done)
        try:
            _engine(req, pending, ctx, write, log, workers, scan.tasks)
        finally:
            progress.close()
            interrupted = tally.done < tally.total
            row = summary_row(tally, ctx.batch_id, req.output, req.engine, " ".join(req.inputs))
            if interrupted:
                row["status"] = "failed"
                row["error"] = f"stopped after {tally.done} of {tally.total} items; rerun the same command to resume"
            log.append(row)
            click.echo(summary_text(tally, ctx.batch_id, req.output), err=True)
    return Outcome(ctx.batch_id, tally.ok, tally.failed + earlier_failed, skipped)


def _engine(req: Request, pending, ctx: Context, write, log, workers: int, tasks: dict[str, int]) -> None:
    if req.engine == "ray":
        from taskrun.runner.batch.ray_engine import run_ray
        from taskrun.runner.batch.work import BATCHED

        # A Ray batch is what one actor call runs: a job's worth for batched tasks; one item for
        # the others, so items spread over the actors and each line is written as it is done.
        size = req.chunk if set(tasks) <= BATCHED else 1
        run_ray(
            pending, ctx, write, log=log, address=req.ray_address, actors=req.actors, output=req.output, batch_size=size
        )
    else:
        from taskrun.runner.batch.local import run_local

        run_local(pending, ctx, write, log=log, workers=workers)
