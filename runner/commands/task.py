"""What a task subcommand does once click has parsed it: run the job (and its --then stages, a
chain built in code), print, write, exit."""

from __future__ import annotations

from typing import Any

import click

from taskrun.runner.chains.run import (
    ChainRun,
    FirstStep,
    NothingProduced,
    StageView,
    run_steps,
    then_chain,
)
from taskrun.runner.inputs import gather_inputs, options_from
from taskrun.runner.jobs import new_id
from taskrun.runner.output.paths import (
    check_cache_folder,
    check_output_path,
    check_side_outputs,
    job_paths,
)
from taskrun.runner.output.writer import EventPrinter, emit, pick_format
from taskrun.runner.runlog.store import RunLog
from taskrun.tasks import get_task
from taskrun.tasks.base import Task


class CommandView(StageView):
    """A task command's output: the first job's result in the format asked, each --then stage's
    result after a "── task ──" header, every stage's metrics table as it ends."""

    def __init__(self, fmt: str | None, output: str | None, json_mode: bool, quiet: bool) -> None:
        self.fmt, self.output, self.json_mode, self.quiet = fmt, output, json_mode, quiet

    def begin(self, i, step) -> None:
        if i and not self.quiet and not self.json_mode:
            click.secho(f"\n── {step.task} ──", err=True, bold=True)

    def printer(self, i, task) -> EventPrinter:
        # The items of a file format (srt, npy) are not printed as they come: the file is the result.
        show_items = self.fmt in (None, "text") or self.json_mode if i == 0 else True
        return EventPrinter(task, None, json_mode=self.json_mode, quiet=self.quiet, show_items=show_items)

    def done(self, i, step, rec) -> None:
        fmt, output = (self.fmt, self.output) if i == 0 else (None, None)
        emit(get_task(step.task), rec, fmt, output, self.json_mode, self.quiet)


def execute(
    task: Task,
    *,
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
    offline,
    log_db,
    quiet,
    extras: dict[str, Any],
    server: str | None = None,
) -> None:
    fmt = pick_format(task, fmt, output)
    if fmt == "json":
        json_mode = True
    if output:
        check_output_path(output, job_paths(task, inputs, files, values))
    check_side_outputs(task, values)
    check_cache_folder(quiet)
    if server and not quiet:  # a lone job went to runner/remote/client.py; a chain runs here
        click.secho("note: --then chains run here, not on --server", err=True, fg="yellow")
    log = RunLog(log_db)
    chain = then_chain(task, extras.get("then") or (), model)
    # A lone task is a job of no chain; with --then, every stage's row carries one chain id.
    run = ChainRun(chain, new_id() if len(chain.steps) > 1 else None, out_dir=None)
    first = FirstStep(lambda: gather_inputs(task, inputs, files), lambda: options_from(task, values, fmt), runtime)
    try:
        run_steps(
            run,
            CommandView(fmt, output, json_mode, quiet),
            first=first,
            device=device,
            dtype=dtype,
            offline=offline,
            log=log,
        )
    except NothingProduced:
        pass  # every input of that stage failed: its errors are printed and counted below
    failed = sum(len(r.errors) for r in run.records)
    if failed:
        total = sum(r.n_inputs for r in run.records)
        raise click.ClickException(f"{failed} of {total} inputs failed (see the errors above); the others finished")
    cut = sum(r.partial_not_accepted for r in run.records)
    if cut:  # a result made of what could be read (a recording cut short): shown, logged partial
        raise click.ClickException(
            f"{cut} result(s) are partial (see the warnings above); pass --allow-partial to accept them"
        )
