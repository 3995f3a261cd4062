"""Where taskrun may write, checked before any model loads: -o and the folders path options write
into are refused when writing them would surprise (a device, a folder, a link, the job's own input, a
folder that cannot take a file), and a name from a chain file stays inside its output folder."""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
from pathlib import Path

import click

from taskrun.runner.output.terminal import for_terminal
from taskrun.tasks.base import Task, TaskError


def check_output_path(output: str, inputs: tuple[str, ...] = ()) -> None:
    """Refuse an -o path before any model loads, when writing it would surprise: a folder, a device
    or other special file (``-o /dev/null`` as root would replace the system's /dev/null with a
    regular file), a symbolic link (the whole-file write replaces the link, not what it points to:
    name the target to write it), one of the job's own ``inputs`` (the result would replace what it
    was made from), or a folder that does not exist or cannot be written (probed by creating and
    removing a temporary file there, so a read-only disk fails now rather than after the work)."""
    p = Path(output)
    shown = for_terminal(output, 200)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a name too long, a file in place of a folder on the way
        raise TaskError(f"cannot write {shown}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise TaskError(
            f"-o {shown} is a symbolic link (to {for_terminal(os.readlink(p), 200)}); taskrun "
            f"would replace the link itself. Give the file it points to, -o "
            f"{for_terminal(str(p.resolve()), 200)}, or remove the link"
        )
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise TaskError(f"-o {shown} is a folder; name a file in it, e.g. {shown.rstrip('/')}/out.txt")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise TaskError(
            f"-o {shown} is a device or special file, not a regular file; taskrun writes "
            f"results whole into regular files. To discard the result, leave out -o and "
            f"redirect stdout (> /dev/null), or use -q"
        )
    if st is not None:
        for src in inputs:
            if src and _same_file(p, src):
                raise TaskError(
                    f"-o {shown} is also an input of this job; writing it would replace "
                    f"the input with the result. Pick another output name"
                )
    check_writable_folder(p.resolve().parent, f"cannot write {shown}")


def job_paths(task: Task, inputs: tuple[str, ...], files: tuple[str, ...], values: dict) -> tuple[str, ...]:
    """The paths a job reads: its path arguments, -f files, and options that name input files
    (--corpus, --json-schema); -o must not be one of them."""
    from taskrun.runner.inputs import is_path

    opts = [
        str(v)
        for f in dataclasses.fields(task.Options)
        if f.metadata.get("path") and (v := values.get(f.name)) and f.name not in OUTPUT_OPTIONS
    ]
    return tuple(a for a in inputs if is_path(a)) + tuple(files) + tuple(opts)


# Path options that name where a task writes (checked like -o's folder), not what it reads.
OUTPUT_OPTIONS = ("out_dir", "annotate")


def check_side_outputs(task: Task, values: dict) -> None:
    """The folders that path options write into (image --out-dir, detect --annotate) are checked
    like -o's, before any model loads."""
    for name in OUTPUT_OPTIONS:
        v = values.get(name)
        if not v:
            continue
        p = Path(v)
        folder = p if name == "out_dir" else p.resolve().parent
        if name == "out_dir" and not p.exists():
            continue  # the task makes its --out-dir; its parent must take a new folder
        check_writable_folder(folder.resolve(), f"cannot write into --{name.replace('_', '-')} {for_terminal(v, 200)}")


def check_cache_folder(quiet: bool = False) -> bool:
    """Say once, before any model loads, when taskrun's cache folder cannot be written: jobs still
    run (digests are recomputed, a search index is not kept), but converted models cannot be made."""
    from taskrun.models.resolve import cache_dir

    try:
        check_writable_folder(cache_dir(), "taskrun's cache")
        return True
    except (TaskError, OSError) as exc:
        if not quiet:
            click.secho(
                f"note: {for_terminal(str(exc), 400)}. Jobs still run, but nothing is cached; "
                f"set TASKRUN_CACHE_DIR to a writable folder",
                err=True,
                fg="yellow",
            )
        return False


def _same_file(a: Path, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_writable_folder(folder: Path, what: str) -> None:
    """Raise a TaskError starting with ``what`` unless a file can be created in ``folder``: the
    folder must exist, and a temporary file is created there and removed (permissions alone do not
    say: root ignores them, and a read-only mount or a full quota overrides them)."""
    if not folder.is_dir():
        raise TaskError(f"{what}: folder {for_terminal(str(folder), 200)} does not exist; create it first")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".taskrun-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise TaskError(
            f"{what}: folder {for_terminal(str(folder), 200)} is not writable "
            f"({exc.strerror or exc}); pick another place"
        ) from None


def confine(folder: Path, name: str, where: str) -> Path:
    """``folder / name`` for a file name that comes from a chain file, refused (naming ``where``, the
    chain file and key) unless it stays inside ``folder``: no absolute path, no "..", and no link
    inside the folder that leads out of it."""
    target = folder / inside_name(name, where)
    base = folder.resolve()
    if not target.resolve().is_relative_to(base):
        raise TaskError(
            f"{where} = {for_terminal(repr(name), 200)} leads outside the output folder "
            f"{for_terminal(str(base), 200)} (through a link); give another name"
        )
    return target


def inside_name(name: str, where: str) -> Path:
    """``name`` as a relative path that cannot climb out of the folder it is joined to."""
    pure = Path(name)
    if not name or pure.is_absolute() or ".." in pure.parts or name.startswith("~"):
        raise TaskError(
            f"{where} = {for_terminal(repr(name), 200)} would write outside the output "
            f'folder; give a file name inside it, e.g. "{for_terminal(pure.name, 80) or "out.txt"}"'
        )
    return pure
