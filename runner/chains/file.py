"""A chain file read and its shape checked: the keys, the kinds of inputs, each step's keys and the
types of its options (against the task's Options), artifact names that stay in the output folder.
The format is described in runner/chains/run.py, which runs chains."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrun.runner.output.paths import inside_name
from taskrun.runner.output.terminal import for_terminal
from taskrun.tasks.base import Task, TaskError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CHAIN_DIR = Path(__file__).resolve().parents[2] / "configs" / "chains"  # taskrun/configs/chains
INPUT_KINDS = ("text", "audio", "image", "path")


@dataclass
class Step:
    task: str
    input: str | None = None  # the name of a chain input or an earlier output
    template: str | None = None  # or: text built from named values
    output: str | None = None
    options: dict = field(default_factory=dict)
    model: str | None = None
    artifact: str | None = None  # file name in the output folder for this step's output
    title: str = ""


@dataclass
class Chain:
    name: str
    description: str
    inputs: dict[str, str]  # name → kind, in the order INPUT… arguments fill them
    steps: list[Step]
    path: str = ""


def available() -> list[str]:
    return sorted(p.stem for p in CHAIN_DIR.glob("*.toml"))


def load_chain(name_or_file: str) -> Chain:
    """A chain by name (configs/chains/NAME.toml) or from a TOML file; its shape checked."""
    p = _chain_file(name_or_file)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(
            f"{for_terminal(str(p), 200)} is not valid TOML ({for_terminal(str(exc), 200)}); fix the chain file"
        ) from None
    except RecursionError:  # tables or arrays nested thousands deep
        raise TaskError(
            f"{for_terminal(str(p), 200)} nests tables or arrays too deeply to read; a chain "
            f"file is a few flat tables: fix the chain file"
        ) from None
    except OSError as exc:
        raise TaskError(f"cannot read {for_terminal(str(p), 200)} ({exc.strerror or exc})") from None
    return parse_chain(raw, str(p))


def _chain_file(name_or_file: str) -> Path:
    for p in (Path(name_or_file), CHAIN_DIR / f"{name_or_file}.toml"):
        try:
            if p.is_file():
                return p
        except OSError:  # a name too long to be a file
            pass
    raise TaskError(
        f"no chain named '{for_terminal(name_or_file, 80)}': not a file, and not one of "
        f"{', '.join(available()) or 'the chains in configs/chains/'}"
    )


# What each key of a step holds; options are checked against the task's Options in check_chain.
_STEP_TYPES = {
    "task": str,
    "input": str,
    "template": str,
    "output": str,
    "model": str,
    "artifact": str,
    "title": str,
    "options": dict,
}


def parse_chain(raw: dict, path: str = "") -> Chain:
    where = for_terminal(path, 200) or "the chain"
    unknown = set(raw) - {"name", "description", "inputs", "steps"}
    if unknown:
        raise TaskError(
            f"{where}: unknown key(s) {_names(unknown)}; a chain has name, description, inputs and [[steps]]"
        )
    for key in ("name", "description"):
        if not isinstance(raw.get(key, ""), str):
            raise TaskError(f'{where}: {key} must be a string, e.g. {key} = "..."')
    inputs = raw.get("inputs") or {}
    if not isinstance(inputs, dict) or not inputs:
        raise TaskError(f'{where}: declare the chain\'s inputs, e.g. inputs = {{ recording = "audio" }}')
    for n, kind in inputs.items():
        if not isinstance(kind, str) or kind not in INPUT_KINDS:
            raise TaskError(
                f"{where}: input '{for_terminal(n, 80)}' has kind {for_terminal(repr(kind), 80)}; "
                f"use one of {', '.join(INPUT_KINDS)}"
            )
    steps_raw = raw.get("steps") or []
    if not isinstance(steps_raw, list) or not steps_raw:
        raise TaskError(f"{where}: a chain needs at least one [[steps]] table")
    steps = [_parse_step(s, i, where) for i, s in enumerate(steps_raw, 1)]
    return Chain(
        name=for_terminal(raw.get("name") or Path(path).stem, 120),
        description=raw.get("description", ""),
        inputs=dict(inputs),
        steps=steps,
        path=path,
    )


def _parse_step(s: Any, i: int, where: str) -> Step:
    if not isinstance(s, dict):
        raise TaskError(f"{where}: step {i} is not a table; write each step as a [[steps]] table")
    bad = set(s) - set(_STEP_TYPES)
    if bad:
        raise TaskError(
            f"{where}: step {i} has unknown key(s) {_names(bad)}; a step takes {', '.join(sorted(_STEP_TYPES))}"
        )
    if "task" not in s:
        raise TaskError(f'{where}: step {i} names no task; add task = "..."')
    for key, value in s.items():
        want = _STEP_TYPES[key]
        if not isinstance(value, want):
            example = "options = { max_tokens = 5 }" if want is dict else f'{key} = "..."'
            raise TaskError(
                f"{where}: step {i} {key} must be {'a table' if want is dict else 'a string'}, "
                f"e.g. {example} (got {_kind(value)})"
            )
    if s.get("artifact") is not None:
        inside_name(s["artifact"], f"{where}: step {i} artifact")
    return Step(**s)


def _names(keys) -> str:
    return ", ".join(for_terminal(str(k), 80) for k in sorted(keys, key=str))


def _kind(value: Any) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true/false",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


_TYPE_WORDS = {
    bool: ("true or false", "true"),
    int: ("an integer", "5"),
    float: ("a number", "0.7"),
    str: ("a string", '"..."'),
    tuple: ("an array", '["..."]'),
}


def _typed_options(task: Task, opts: dict, where: str) -> dict:
    """A step's options checked against the types of the task's Options fields (a TOML value of the
    wrong type would otherwise fail deep inside the task with a message that names no option);
    an integer where a number is wanted becomes a float, an array a tuple."""
    fields = {f.name: f for f in dataclasses.fields(task.Options)}
    out = {}
    for k, v in opts.items():
        want = _field_kind(fields[k]) if k in fields else None
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        elif want is tuple and isinstance(v, list):
            v = tuple(v)
        if want is not None and (not isinstance(v, want) or isinstance(v, bool) and want is not bool):
            words, example = _TYPE_WORDS[want]
            raise TaskError(
                f"{where}: option {for_terminal(k, 80)} must be {words}, e.g. {k} = {example} "
                f"(got {_kind(v)} {for_terminal(repr(v), 60)})"
            )
        choices = fields[k].metadata.get("choices") if k in fields else None
        if choices and v not in choices:
            raise TaskError(f"{where}: option {k} is {for_terminal(repr(v), 60)}; use one of {', '.join(choices)}")
        out[k] = v
    return out


def _field_kind(f: dataclasses.Field) -> type | None:
    """What an Options field holds: from its default, or its annotation when the default is None."""
    d = f.default
    for t in (bool, int, float, str, tuple):
        if isinstance(d, t):
            return t
    ann = str(f.type)
    for name, t in (("float", float), ("int", int), ("str", str)):
        if d is None and ann.startswith(name):
            return t
    return None
