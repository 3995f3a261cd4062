"""What `run batch` reads: a JSONL file (OpenAI Batch requests or taskrun jobs) or a task with
folders, globs and files; each item with a stable id.

The input is read twice, line by line, and never held whole: a first pass (``scan``) checks its
structure (JSON objects, one format, unique ids) before any model loads, names every bad line in
one error, and counts the items for the progress bar; the second (``entries``) hands the items out
as they are run, reading only the bytes the file had at the scan (lines appended meanwhile are
left for the next run, so no id is run twice).

Ids: an OpenAI line's ``custom_id`` (required, as OpenAI requires it); a taskrun line's ``id``, or
``line-N`` when it has none; a file's path relative to the folder it was found in (a glob's or a
named file's path as given); a line of a text file ``PATH:N``. The same command gives the same ids
again, so a rerun resumes.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from taskrun.tasks import REGISTRY, get_task
from taskrun.tasks.base import TaskError
from taskrun.tasks.inputs import sniff

TASKRUN, OPENAI, FILES = "taskrun", "openai", "files"
OPENAI_KEYS = {"custom_id", "method", "url", "body"}
SHOWN = 20  # bad input lines listed in one error; the rest are counted


@dataclass(frozen=True)
class Entry:
    """One item of the input: where it is (1-based line or place in the listing), its id, the
    input's format, and the job as a JSON object (a file or text line becomes a taskrun job)."""

    n: int
    id: str
    flavour: str
    line: dict


@dataclass
class Scan:
    """What the first pass found: the format, how many items there are, and of which tasks."""

    flavour: str
    total: int
    tasks: dict[str, int] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)  # to count what a resume skips; dropped after


def task_of(entry: Entry) -> str | None:
    """The task an item names (before it is parsed; None when it names none)."""
    if entry.flavour == OPENAI:
        from taskrun.tasks.wire.openai_api import TASK_OF

        return TASK_OF.get(entry.line.get("url"))
    task = entry.line.get("task")
    return task if isinstance(task, str) else None


def flavour_of(obj: dict) -> str | None:
    """OpenAI Batch lines carry custom_id/url/body; taskrun jobs carry task/input."""
    if OPENAI_KEYS & set(obj):
        return OPENAI
    if "task" in obj or "input" in obj:
        return TASKRUN
    return None


class JsonlInput:
    """A JSONL file of OpenAI Batch requests or taskrun jobs (the format read from line 1)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise TaskError(
                f"{path}: no such file; `run batch` takes a JSONL file, or a task and "
                f"folders: run batch transcribe recordings/ -o out.jsonl"
            )
        self.end: int | None = None  # the input's size at scan: what the batch reads

    def _objects(self, problems: list[str] | None) -> Iterator[tuple[int, dict]]:
        """(line number, object) of each job line, within the bytes the input had at ``scan``
        (lines appended while the batch runs are not read: the ids stay those it checked)."""
        end = self.end if self.end is not None else os.stat(self.path).st_size
        pos = 0
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if pos >= end:
                    return
                raw, pos = raw[: end - pos], pos + len(raw)
                if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    self._bad(
                        problems, f"{self.path} line {n} is not UTF-8 (byte {exc.start}); fix or remove that line"
                    )
                    continue
                except json.JSONDecodeError as exc:
                    self._bad(
                        problems,
                        f"{self.path} line {n} is not JSON ({exc.msg}, column {exc.colno}); fix or remove that line",
                    )
                    continue
                if not isinstance(obj, dict):
                    self._bad(problems, f"{self.path} line {n} is not a JSON object; each line is one job")
                    continue
                yield n, obj

    @staticmethod
    def _bad(problems: list[str] | None, message: str) -> None:
        """A bad line: raised at once, or (``scan``) gathered so that all are named in one error."""
        if problems is None:
            raise TaskError(message)
        problems.append(message)

    def entries(self, problems: list[str] | None = None) -> Iterator[Entry]:
        first = None
        for n, obj in self._objects(problems):
            flavour = flavour_of(obj)
            if flavour is None:
                self._bad(
                    problems,
                    f"{self.path} line {n} is neither an OpenAI Batch request "
                    f'({{"custom_id", "method", "url", "body"}}) nor a taskrun job '
                    f'({{"id", "task", "input", "options", "model"}})',
                )
                continue
            if first is None:
                first = (n, flavour)
            elif flavour != first[1]:
                self._bad(
                    problems,
                    f"{self.path} line {n} is {_named(flavour)} but line {first[0]} is "
                    f"{_named(first[1])}; one file holds one format: split it in two",
                )
                continue
            try:
                item_id = self._id(n, obj, flavour)
            except TaskError as exc:
                self._bad(problems, str(exc))
                continue
            yield Entry(n, item_id, flavour, obj)

    def _id(self, n: int, obj: dict, flavour: str) -> str:
        if flavour == OPENAI:
            cid = obj.get("custom_id")
            if not isinstance(cid, str) or not cid:
                raise TaskError(
                    f"{self.path} line {n} has no custom_id; every OpenAI Batch request "
                    f'needs a unique "custom_id" string'
                )
            return cid
        given = obj.get("id")
        if given is None:
            return f"line-{n}"
        if not isinstance(given, (str, int)) or isinstance(given, bool) or given == "":
            raise TaskError(f'{self.path} line {n}: "id" must be a non-empty string or a number')
        return str(given)

    def scan(self) -> Scan:
        """Check every line before anything loads: JSON objects, one format, unique ids. Every
        bad line is named in one error (the first ``SHOWN``, then how many more), and the input's
        size is fixed here: ``entries`` reads no further."""
        self.end = os.stat(self.path).st_size
        seen: dict[str, int] = {}
        tasks: dict[str, int] = {}
        problems: list[str] = []
        flavour = None
        for e in self.entries(problems):
            if e.id in seen:
                problems.append(
                    f"id {e.id!r} is on line {seen[e.id]} and line {e.n} of {self.path}; "
                    f"ids must be unique (they key the output and the resume)"
                )
                continue
            seen[e.id] = e.n
            flavour, task = e.flavour, task_of(e) or "?"
            tasks[task] = tasks.get(task, 0) + 1
        if problems:
            if len(problems) == 1:
                raise TaskError(problems[0])
            more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
            raise TaskError(
                f"{len(problems)} bad lines in {self.path}; fix them all, then run again:\n  "
                + "\n  ".join(problems[:SHOWN])
                + more
            )
        if flavour is None:
            raise TaskError(f"{self.path} holds no jobs (it is empty)")
        return Scan(flavour, len(seen), tasks, set(seen))


def _named(flavour: str) -> str:
    return "an OpenAI Batch request" if flavour == OPENAI else "a taskrun job"


class FilesInput:
    """A task and folders (every file of the kinds the task takes, recursively), globs and files.
    A text file given to a task that reads text line by line is one item per non-blank line."""

    def __init__(self, task: str, paths: tuple[str, ...]) -> None:
        self.task = get_task(task)
        self.paths = paths
        kinds = self.task.input_kinds
        # As `run TASK folder/` does: notes beside the photos are not inputs of an image task.
        self.kinds = tuple(k for k in kinds if k != "text") or kinds
        self.by_lines = "text" in kinds and self.task.text_file == "lines"

    def _files(self) -> Iterator[tuple[str, Path]]:
        """(id, path) of every file, in a stable order."""
        for arg in self.paths:
            p = Path(arg)
            if p.is_dir():
                found = [
                    f
                    for f in sorted(p.rglob("*"))
                    if f.is_file() and not f.name.startswith(".") and f.stat().st_size and sniff(f) in self.kinds
                ]
                if not found:
                    raise TaskError(f"{arg} holds no {' or '.join(self.kinds)} files for {self.task.name}")
                yield from ((f.relative_to(p).as_posix(), f) for f in found)
            elif p.is_file():
                yield os.path.normpath(arg), p
            elif glob.has_magic(arg):
                matches = sorted(m for m in glob.glob(arg, recursive=True) if Path(m).is_file())
                if not matches:
                    raise TaskError(f"{arg} matches no files")
                yield from ((os.path.normpath(m), Path(m)) for m in matches)
            else:
                raise TaskError(f"{arg}: no such file or folder")

    def entries(self) -> Iterator[Entry]:
        n = 0
        for fid, path in self._files():
            if self.by_lines and sniff(path) == "text":
                for k, text in _lines(path):
                    n += 1
                    yield Entry(n, f"{fid}:{k}", FILES, {"task": self.task.name, "input": {"text": text}})
            else:
                n += 1
                yield Entry(n, fid, FILES, {"task": self.task.name, "input": {"path": str(path)}})

    def scan(self) -> Scan:
        seen: dict[str, int] = {}
        for e in self.entries():
            if e.id in seen:
                raise TaskError(
                    f"two inputs have the id {e.id!r} (items {seen[e.id]} and {e.n}): "
                    f"files of two folders share a relative path; give one common folder"
                )
            seen[e.id] = e.n
        if not seen:
            raise TaskError(f"no inputs for {self.task.name} in {', '.join(self.paths)}")
        return Scan(FILES, len(seen), {self.task.name: len(seen)}, set(seen))


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line, read as a stream."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            for k, line in enumerate(f, 1):
                if line.strip():
                    yield k, line.strip()
    except UnicodeDecodeError as exc:
        raise TaskError(
            f"{path} is not UTF-8 text (byte {exc.start}); convert it, e.g. `iconv -f latin1 -t utf-8 {path}`"
        ) from None


def open_input(args: tuple[str, ...]) -> JsonlInput | FilesInput:
    """``INPUT.jsonl`` alone, or ``TASK PATH...``."""
    if not args:
        raise TaskError(
            "name the input: run batch INPUT.jsonl -o OUT.jsonl, or run batch TASK FOLDER_OR_GLOB... -o OUT.jsonl"
        )
    if args[0] in REGISTRY and (len(args) > 1 or not Path(args[0]).is_file()):
        if len(args) == 1:
            raise TaskError(f"name the files for {args[0]}: run batch {args[0]} FOLDER_OR_GLOB... -o OUT.jsonl")
        return FilesInput(args[0], args[1:])
    if len(args) > 1:
        raise TaskError(
            f"{args[0]} is not a task; give one JSONL file, or a task and folders (tasks: {', '.join(REGISTRY)})"
        )
    return JsonlInput(args[0])
