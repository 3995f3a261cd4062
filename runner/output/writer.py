"""How results and numbers reach the user: results on stdout, progress and metrics on stderr,
files written whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from taskrun.runner.output.paths import check_output_path  # noqa: F401  (runner/remote/client.py imports it here)
from taskrun.runner.output.terminal import for_terminal
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
    return for_terminal("\n".join(lines))  # a model path typed by the user may hold anything


class EventPrinter:
    """Renders a job's events as they come: streamed text and items on stdout, progress on stderr.
    Control characters from inputs or models are escaped (:func:`for_terminal`); --json is exact."""

    def __init__(
        self, task, options, *, json_mode: bool, stream: bool = True, show_items: bool = True, quiet: bool = False
    ) -> None:
        self.task, self.options = task, options
        self.json_mode, self.stream, self.show_items, self.quiet = json_mode, stream, show_items, quiet
        self.streamed: set[int] = set()
        self.bar = None
        self.err_count = 0

    def __call__(self, event: Any) -> None:
        if isinstance(event, ev.Token):
            if self.stream and not self.json_mode and self.show_items:
                click.echo(for_terminal(event.text), nl=False)
                sys.stdout.flush()
                self.streamed.add(event.index)
        elif isinstance(event, ev.Partial):
            if self.stream and not self.json_mode and self.show_items:
                self._clear_bar_line()
                click.echo(for_terminal(self.task.render_partial(event.value, self.options)))
                self.streamed.add(event.index)
        elif isinstance(event, (ev.Step, ev.Progress)):
            self._progress(event)
        elif isinstance(event, ev.Item):
            if not self.json_mode and self.show_items:
                if event.index in self.streamed:
                    tail = self.task.render_tail(event.result, self.options)
                    click.echo("")
                    if tail:
                        click.echo(for_terminal(tail), err=True)
                else:
                    self._clear_bar_line()
                    click.echo(for_terminal(self.task.render(event.result, self.options)))
        elif isinstance(event, ev.Notice):  # shown even with -q: it changes what the results mean
            self._clear_bar_line()
            click.secho(f"note: {for_terminal(event.message, 4000)}", err=True, fg="yellow")
        elif isinstance(event, ev.ItemError):
            self.err_count += 1
            self._clear_bar_line()
            click.secho(f"error: {for_terminal(event.describe(), 4000)}", err=True, fg="red")
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
                self.bar = tqdm(
                    total=event.total, unit=event.unit, file=sys.stderr, leave=False, desc=event.label or None
                )
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


# -o suffixes that hold the text format. Any other suffix that is not one of the task's formats
# (x.mp3, v.npz) is refused: plain text under a media or data name is a file no tool can open.
TEXT_SUFFIXES = ("", "txt", "text", "md", "log", "out")


def pick_format(task: Task, fmt: str | None, output: str | None) -> str | None:
    """The output format: as given, or from the -o file's suffix when it names one of the task's.
    A task with a ``check_output`` hook refuses an -o file it cannot write here, before any load.
    An explicit ``--format`` wins over the suffix (``--format srt -o subs.txt`` is fine)."""
    check = getattr(task, "check_output", None)
    if output and check is not None:
        check(output, fmt)
    if fmt is None and output:
        suffix = Path(output).suffix.lstrip(".").lower()
        if suffix in task.formats:
            return suffix
        if task.writes_files and suffix not in ("json", "txt"):
            raise TaskError(
                f"{task.name} writes {task.writes_files.upper()} files; name the output "
                f"{Path(output).stem or 'out'}.{task.writes_files}"
            )
        if suffix not in TEXT_SUFFIXES:
            named = ", ".join(f".{f}" for f in task.formats if f != "text")
            raise TaskError(
                f"{task.name} does not write {for_terminal(Path(output).name, 80)}: its formats "
                f"are text (.txt), {named}; name the output e.g. "
                f"{for_terminal(Path(output).stem, 80) or 'out'}.txt, or give --format"
            )
    return fmt


def emit(task: Task, rec, fmt: str | None, output: str | None, json_mode: bool, quiet: bool) -> None:
    """A finished job's result, in the format asked, to stdout or ``output``; its metrics to stderr.
    A write that fails at this last step (a full disk, a folder removed meanwhile) does not lose the
    result: see :func:`deliver`."""
    results = rec.results
    if json_mode and task.writes_files and results:
        # The files are the result (images): write them, name them in the JSON, and keep stdout
        # for the JSON alone (the writer lists the paths it wrote on stdout in text mode).
        ext = task.writes_files
        target = Path(output) if output and output.lower().endswith("." + ext) else None
        with contextlib.redirect_stdout(sys.stderr), _write_errors(task):
            task.write(results, ext, target, rec.options)
        print_json(rec.to_json())
    elif json_mode:
        if output:
            deliver(output, json.dumps(to_jsonable(rec.to_json()), ensure_ascii=False, indent=1))
        else:
            print_json(rec.to_json())
    elif fmt not in (None, "text"):
        if results:
            _write_format(task, rec, fmt, output)
    elif output and results:
        deliver(output, "\n".join(task.render(r, rec.options) for r in results) + "\n")
    if not quiet:
        click.echo(metrics_table(rec), err=True)
    sys.stdout.flush()


def _write_format(task: Task, rec, fmt: str, output: str | None) -> None:
    with _write_errors(task):
        text = task.write(rec.results, fmt, Path(output) if output else None, rec.options)
    if text is None:
        return
    if output:
        deliver(output, text)
    elif isinstance(text, bytes):
        sys.stdout.buffer.write(text)
    else:
        click.echo(text, nl=not text.endswith("\n"))


@contextlib.contextmanager
def _write_errors(task: Task):
    """A task that writes its own files (images, annotated pictures): an OSError is a clear error."""
    try:
        yield
    except OSError as exc:
        where = f" {for_terminal(exc.filename, 200)}" if exc.filename else ""
        raise TaskError(
            f"{task.name} could not write{where} ({exc.strerror or exc}); the job ran and "
            f"is in the run log, but its files were not written"
        ) from None


def deliver(output: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``output`` whole; if that fails, keep the result and fail clearly.

    Text is printed on stdout; bytes are saved to a temporary file whose path is named (or, when
    stdout is not a terminal, written there). Either way the error (non-zero exit) says what failed
    and where the result went."""
    from taskrun.runner.output.safe import check_target

    try:
        check_target(output)  # again at write time: a link or device put there while the job ran
        atomic_write(output, data)
        return
    except OSError as exc:
        why = exc.strerror or str(exc)
    except TaskError as exc:  # the folder went away while the job ran
        why = str(exc)
    shown = for_terminal(str(output), 200)
    if isinstance(data, str):
        click.echo(data, nl=not data.endswith("\n"))
        sys.stdout.flush()
        where = "the result is printed above on stdout instead"
    else:
        where = _save_aside(data, Path(output))
    raise TaskError(f"could not write {shown} ({why}); {where}")


def _save_aside(data: bytes, output: Path) -> str:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"taskrun-{output.stem[:40]}-", suffix=output.suffix[:12])
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return f"the result is saved in {tmp} instead"
    except OSError:
        if sys.stdout.isatty():
            return "and no temporary file could be written either: the result is lost"
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return "the result is written to stdout instead"
