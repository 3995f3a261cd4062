"""What a task command's arguments mean: the inputs (texts, files, folders, stdin) and the options."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from pathlib import Path
from typing import Any

from taskrun.tasks.base import Input, Task, TaskError, make_options
from taskrun.tasks.inputs import file_input, is_path, lines_of, sniff, text_input


def gather_inputs(task: Task, args: tuple[str, ...], files: tuple[str, ...]) -> list[Input]:
    """Positional args (texts or paths), -f files and folders, or stdin → Inputs, kinds sniffed."""
    out: list[Input] = []
    takes_text = "text" in task.input_kinds
    for i, arg in enumerate(args, 1):
        p = Path(arg)
        if is_path(arg):
            out += _path_inputs(task, p)
        elif takes_text:
            out.append(text_input(arg, f"argument {i}"))
        else:
            raise TaskError(f"{arg}: no such file; {task.name} takes {task.takes}")
    for f in files:
        out += _path_inputs(task, Path(f))
    if not args and not files and not sys.stdin.isatty():
        data = read_stdin()
        if data.strip():
            if not takes_text:
                raise TaskError(f"{task.name} takes {task.takes}, not text on stdin; name the files")
            if task.text_file == "lines":
                out += [
                    Input(source=f"stdin:{n}", kind="text", text=line.strip())
                    for n, line in enumerate(data.splitlines(), 1)
                    if line.strip()
                ]
            else:
                out.append(text_input(data, "stdin"))
    return out


def read_stdin() -> str:
    """stdin as text: UTF-8 (a BOM is dropped), or a clear error naming the fix. Decoded here, not
    by Python's stdin, whose errors (or silently kept surrogates, in a C locale) name no fix."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text-only stdin (an embedding program's)
        return sys.stdin.read()
    data = buffer.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskError(
            f"stdin is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); "
            f"convert it first, e.g. `iconv -f latin1 -t utf-8`"
        ) from None


def _path_inputs(task: Task, p: Path) -> list[Input]:
    if p.is_dir():
        # A folder given to a task that takes files (images, audio) means those files: notes
        # or READMEs beside the photos are not inputs.
        kinds = tuple(k for k in task.input_kinds if k != "text") or task.input_kinds
        return folder_inputs(p, kinds)
    try:
        inp = file_input(p)
    except OSError as exc:
        raise TaskError(f"cannot read {p} ({exc.strerror or exc})") from None
    if inp.kind == "text" and "text" in task.input_kinds and task.text_file == "lines":
        return lines_of(p)
    return [inp]


def folder_inputs(folder: Path, kinds: tuple[str, ...]) -> list[Input]:
    """The files of ``folder`` whose kind is one of ``kinds`` (sorted, recursive, hidden and empty
    files left out, links not followed out of it). A file that cannot be read (no permission, not a
    regular file, text that is not UTF-8) is not dropped in silence: it becomes an input of kind
    ``unreadable`` that the job reports as a failed item, so the batch finishes the rest and exits
    non-zero, as a batch that meets a bad file does."""
    out: list[Input] = []

    def failed(f: Path, why: str) -> None:
        out.append(Input(source=str(f), kind="unreadable", text=f"{f}: cannot read it ({why})", path=str(f)))

    for top, dirs, names in os.walk(
        folder, onerror=lambda exc: failed(Path(exc.filename or folder), exc.strerror or str(exc))
    ):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            f = Path(top) / name
            try:
                st = f.lstat()
                if stat.S_ISLNK(st.st_mode):
                    st = f.stat()
                if not stat.S_ISREG(st.st_mode):
                    failed(f, "not a regular file")
                elif st.st_size and sniff(f) in kinds:
                    out.append(file_input(f))
            except OSError as exc:
                failed(f, exc.strerror or str(exc))
            except TaskError as exc:
                out.append(Input(source=str(f), kind="unreadable", text=str(exc), path=str(f)))
    out.sort(key=lambda i: i.source)
    if not out:
        raise TaskError(f"{folder} holds no {' or '.join(kinds)} files")
    return out


def options_from(task: Task, values: dict[str, Any], fmt: str | None = None) -> Any:
    """Options from CLI values; fields the user did not set keep their dataclass defaults. With the
    output format ``fmt``, a task's ``options_for_format`` hook adds what that format needs (srt and
    vtt ask transcribe for word timestamps, to cut cues between words)."""
    defaults = {f.name: f.default for f in dataclasses.fields(task.Options)}
    given = {}
    for k, v in values.items():
        if isinstance(v, tuple) and not isinstance(defaults.get(k), tuple):
            v = v or defaults.get(k)
        given[k] = v
    options = make_options(task.Options, given)
    adapt = getattr(task, "options_for_format", None)
    return adapt(options, fmt) if adapt is not None and fmt else options
