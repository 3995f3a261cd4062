"""What a task subcommand does once click has parsed it: run the job, print, write, exit."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import click

from taskrun.runner.cli import gather_inputs, options_from
from taskrun.runner.jobs import JobRecord, new_id, run_job
from taskrun.runner.output import EventPrinter, metrics_table, print_json
from taskrun.runner.runlog import RunLog
from taskrun.tasks import get_task
from taskrun.tasks.base import Input, Task, TaskError, atomic_write


def execute(task: Task, *, inputs, files, values, model, runtime, device, dtype, json_mode, fmt, output,
            offline, log_db, quiet, extras: dict[str, Any]) -> None:
    fmt = _pick_format(task, fmt, output)
    if fmt == "json":
        json_mode = True
    if output:
        _check_output_path(output)
    log = RunLog(log_db)
    then, then_models = [], []
    for spec in extras.get("then") or ():
        name, _, next_model = spec.partition("=")  # --then summarize or --then summarize=MODEL
        then.append(get_task(name))
        then_models.append(next_model or None)
    for nxt in then:  # a chain is checked before anything loads
        if task.produces is None or task.produces not in nxt.input_kinds:
            raise TaskError(f"{task.name} cannot feed {nxt.name}: {task.name} produces "
                            f"{task.produces or 'nothing a task takes'}, {nxt.name} takes {nxt.takes}")
    chain_id = new_id() if then else None

    holder: dict[str, Any] = {}

    def make_options():
        holder["options"] = options_from(task, values)
        return holder["options"]

    printer = EventPrinter(task, None, json_mode=json_mode, quiet=quiet,
                           show_items=fmt in (None, "text") or json_mode)

    def on_event(e):
        printer.options = holder.get("options")
        printer(e)

    try:
        rec = run_job(task, lambda: gather_inputs(task, inputs, files), make_options, model=model,
                      runtime=runtime, device=device, dtype=dtype, offline=offline, log=log,
                      on_event=on_event, chain_id=chain_id, stage=0 if chain_id else None)
    finally:
        printer.close()
    _emit(task, rec, fmt, output, json_mode, quiet)
    records = [rec]
    for i, nxt in enumerate(then, 1):
        prev = records[-1]
        if not prev.items:
            break
        prev_task = get_task(prev.task)
        handoff = [Input(source=f"{prev.task} of {it.source}", kind=nxt.input_kinds[0],
                         text=prev_task.handoff(it.result))
                   for it in sorted(prev.items, key=lambda x: x.index)]
        empty = [h.source for h in handoff if not (h.text or "").strip()]
        if empty:
            raise TaskError(f"{prev.task} produced no text to hand to {nxt.name} ({', '.join(empty)}); "
                            f"nothing to {nxt.name}")
        printer = EventPrinter(nxt, None, json_mode=json_mode, quiet=quiet)
        opts = options_from(nxt, {})
        printer.options = opts
        if not quiet and not json_mode:
            click.secho(f"\n── {nxt.name} ──", err=True, bold=True)
        try:
            rec_n = run_job(nxt, lambda h=handoff: h, opts, model=then_models[i - 1], device=device,
                            dtype=dtype, offline=offline, log=log, on_event=printer, chain_id=chain_id,
                            stage=i)
        finally:
            printer.close()
        _emit(nxt, rec_n, None, None, json_mode, quiet)
        records.append(rec_n)
    failed = sum(len(r.errors) for r in records)
    if failed:
        total = sum(r.n_inputs for r in records)
        raise click.ClickException(f"{failed} of {total} inputs failed (see the errors above); "
                                   f"the others finished")


def _pick_format(task: Task, fmt: str | None, output: str | None) -> str | None:
    if fmt is None and output:
        suffix = Path(output).suffix.lstrip(".").lower()
        if suffix in task.formats:
            return suffix
        if task.writes_files and suffix not in ("json", "txt"):
            raise TaskError(f"{task.name} writes {task.writes_files.upper()} files; name the output "
                            f"{Path(output).stem or 'out'}.{task.writes_files}")
    return fmt


def _check_output_path(output: str) -> None:
    parent = Path(output).resolve().parent
    if not parent.is_dir():
        raise TaskError(f"cannot write {output}: folder {parent} does not exist; create it first")


def _emit(task: Task, rec: JobRecord, fmt: str | None, output: str | None, json_mode: bool,
          quiet: bool) -> None:
    results = rec.results
    if json_mode and task.writes_files and results:
        # The files are the result (images): write them, name them in the JSON, and keep stdout
        # for the JSON alone (the writer lists the paths it wrote on stdout in text mode).
        ext = task.writes_files
        target = Path(output) if output and output.lower().endswith("." + ext) else None
        with contextlib.redirect_stdout(sys.stderr):
            task.write(results, ext, target, rec.options)
        if target is not None:
            output = None
        print_json(rec.to_json())
    elif json_mode:
        if output:
            import json

            from taskrun.tasks.base import to_jsonable
            atomic_write(output, json.dumps(to_jsonable(rec.to_json()), ensure_ascii=False, indent=1))
        else:
            print_json(rec.to_json())
    elif fmt not in (None, "text"):
        if results:
            text = task.write(results, fmt, Path(output) if output else None, rec.options)
            if text is not None:
                if output:
                    atomic_write(output, text)
                elif isinstance(text, bytes):
                    sys.stdout.buffer.write(text)
                else:
                    click.echo(text, nl=not text.endswith("\n"))
    elif output and results:
        atomic_write(output, "\n".join(task.render(r, rec.options) for r in results) + "\n")
    if not quiet:
        click.echo(metrics_table(rec), err=True)
    sys.stdout.flush()
