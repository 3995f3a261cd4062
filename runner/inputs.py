"""What a task command's arguments mean: the inputs (texts, files, folders, stdin) and the options."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from taskrun.tasks.base import Input, Task, TaskError, make_options
from taskrun.tasks.inputs import expand_folder, file_input, lines_of, text_input


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
        data = sys.stdin.read()
        if data.strip():
            if not takes_text:
                raise TaskError(f"{task.name} takes {task.takes}, not text on stdin; name the files")
            if task.text_file == "lines":
                out += [Input(source=f"stdin:{n}", kind="text", text=line.strip())
                        for n, line in enumerate(data.splitlines(), 1) if line.strip()]
            else:
                out.append(text_input(data, "stdin"))
    return out


def is_path(arg: str) -> bool:
    """An argument names a file when one exists by that name; a long sentence is not a name."""
    if not arg or "\n" in arg or len(arg) > 4096:
        return False
    try:
        return Path(arg).exists()
    except OSError:  # ENAMETOOLONG and friends: it is text
        return False


def _path_inputs(task: Task, p: Path) -> list[Input]:
    if p.is_dir():
        # A folder given to a task that takes files (images, audio) means those files: notes
        # or READMEs beside the photos are not inputs.
        kinds = tuple(k for k in task.input_kinds if k != "text") or task.input_kinds
        return [file_input(f) for f in expand_folder(p, kinds)]
    inp = file_input(p)
    if inp.kind == "text" and "text" in task.input_kinds and task.text_file == "lines":
        return lines_of(p)
    return [inp]


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
