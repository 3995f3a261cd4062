"""How results and numbers reach the user: results on stdout, progress and metrics on stderr,
files written whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from taskrun.tasks import events as ev
from taskrun.tasks.base import Task, TaskError, atomic_write, to_jsonable


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:,.1f}"
        if abs(v) >= 1:
            return f"{v:.3f}"
        if abs(v) >= 1e-3:
            return f"{v:.4f}"
        return f"{v:.3g}"  # a tiny cost or time keeps its significant digits
    return str(v)


def metrics_table(rec) -> str:
    """The job's numbers: what ran on what, the common metrics, then the task's own."""
    card = rec.card
    lines = []
    if card is not None:
        lines.append(f"model    {card.name}  {card.digest[:19]}  ({card.source})")
        lines.append(f"runtime  {rec.runtime}  device {rec.device}  dtype {rec.dtype}")
    m = rec.metrics_dict()
    width = max((len(k) for k in m), default=0)
    for k, v in m.items():
        if v is None or isinstance(v, (dict, list)):
            continue
        lines.append(f"{k:<{width}}  {fmt_value(v)}")
    lines.append(f"{'run id':<{width}}  {rec.id}")
    return "\n".join(lines)


class EventPrinter:
    """Renders a job's events as they come: streamed text and items on stdout, progress on stderr."""

    def __init__(self, task, options, *, json_mode: bool, stream: bool = True, show_items: bool = True,
                 quiet: bool = False) -> None:
        self.task, self.options = task, options
        self.json_mode, self.stream, self.show_items, self.quiet = json_mode, stream, show_items, quiet
        self.streamed: set[int] = set()
        self.bar = None
        self.err_count = 0

    def __call__(self, event: Any) -> None:
        if isinstance(event, ev.Token):
            if self.stream and not self.json_mode and self.show_items:
                click.echo(event.text, nl=False)
                sys.stdout.flush()
                self.streamed.add(event.index)
        elif isinstance(event, ev.Partial):
            if self.stream and not self.json_mode and self.show_items:
                self._clear_bar_line()
                click.echo(self.task.render_partial(event.value, self.options))
                self.streamed.add(event.index)
        elif isinstance(event, (ev.Step, ev.Progress)):
            self._progress(event)
        elif isinstance(event, ev.Item):
            if not self.json_mode and self.show_items:
                if event.index in self.streamed:
                    tail = self.task.render_tail(event.result, self.options)
                    click.echo("")
                    if tail:
                        click.echo(tail, err=True)
                else:
                    self._clear_bar_line()
                    click.echo(self.task.render(event.result, self.options))
        elif isinstance(event, ev.Notice):  # shown even with -q: it changes what the results mean
            self._clear_bar_line()
            click.secho(f"note: {event.message}", err=True, fg="yellow")
        elif isinstance(event, ev.ItemError):
            self.err_count += 1
            self._clear_bar_line()
            click.secho(f"error: {event.describe()}", err=True, fg="red")
        elif isinstance(event, ev.Done):
            self.close()

    def _progress(self, event) -> None:
        if self.quiet or not sys.stderr.isatty() and not os.environ.get("TASKRUN_PROGRESS"):
            return
        from tqdm import tqdm

        if isinstance(event, ev.Step):
            if self.bar is None:
                self.bar = tqdm(total=event.total, unit="step", file=sys.stderr, leave=False)
            self.bar.set_postfix_str(f"{event.seconds:.3f}s/step")
            self.bar.update(event.step - self.bar.n)
        else:
            if self.bar is None:
                self.bar = tqdm(total=event.total, unit=event.unit, file=sys.stderr, leave=False,
                                desc=event.label or None)
            self.bar.update(event.done - self.bar.n)

    def _clear_bar_line(self) -> None:
        if self.bar is not None:
            self.bar.clear()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def print_json(obj: Any) -> None:
    click.echo(json.dumps(to_jsonable(obj), ensure_ascii=False))


# --------------------------------------------------------------------------- a job's result


def pick_format(task: Task, fmt: str | None, output: str | None) -> str | None:
    """The output format: as given, or from the -o file's suffix when it names one of the task's.
    A task with a ``check_output`` hook refuses an -o file it cannot write here, before any load."""
    check = getattr(task, "check_output", None)
    if output and check is not None:
        check(output, fmt)
    if fmt is None and output:
        suffix = Path(output).suffix.lstrip(".").lower()
        if suffix in task.formats:
            return suffix
        if task.writes_files and suffix not in ("json", "txt"):
            raise TaskError(f"{task.name} writes {task.writes_files.upper()} files; name the output "
                            f"{Path(output).stem or 'out'}.{task.writes_files}")
    return fmt


def check_output_path(output: str) -> None:
    parent = Path(output).resolve().parent
    if not parent.is_dir():
        raise TaskError(f"cannot write {output}: folder {parent} does not exist; create it first")


def emit(task: Task, rec, fmt: str | None, output: str | None, json_mode: bool, quiet: bool) -> None:
    """A finished job's result, in the format asked, to stdout or ``output``; its metrics to stderr."""
    results = rec.results
    if json_mode and task.writes_files and results:
        # The files are the result (images): write them, name them in the JSON, and keep stdout
        # for the JSON alone (the writer lists the paths it wrote on stdout in text mode).
        ext = task.writes_files
        target = Path(output) if output and output.lower().endswith("." + ext) else None
        with contextlib.redirect_stdout(sys.stderr):
            task.write(results, ext, target, rec.options)
        print_json(rec.to_json())
    elif json_mode:
        if output:
            atomic_write(output, json.dumps(to_jsonable(rec.to_json()), ensure_ascii=False, indent=1))
        else:
            print_json(rec.to_json())
    elif fmt not in (None, "text"):
        if results:
            _write_format(task, rec, fmt, output)
    elif output and results:
        atomic_write(output, "\n".join(task.render(r, rec.options) for r in results) + "\n")
    if not quiet:
        click.echo(metrics_table(rec), err=True)
    sys.stdout.flush()


def _write_format(task: Task, rec, fmt: str, output: str | None) -> None:
    text = task.write(rec.results, fmt, Path(output) if output else None, rec.options)
    if text is None:
        return
    if output:
        atomic_write(output, text)
    elif isinstance(text, bytes):
        sys.stdout.buffer.write(text)
    else:
        click.echo(text, nl=not text.endswith("\n"))
