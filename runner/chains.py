"""Chains: several tasks in a row, declared in a TOML file, each stage a logged job of its own.

A chain file (configs/chains/NAME.toml) names its inputs and their kinds, then its steps::

    name = "meeting-notes"
    inputs = { recording = "audio" }          # kinds: text, audio, image, path

    [[steps]]
    task = "transcribe"
    input = "recording"                       # a chain input or an earlier step's output
    output = "transcript"                     # what this step hands on (the task's `produces`)
    artifact = "transcript.txt"               # written to the output folder

    [[steps]]
    task = "summarize"
    input = "transcript"
    output = "summary"
    options = { length = "medium" }           # the task's Options; "{name}" takes a chain input

A step may build its input text from a ``template`` ("Question: {question}\\n{passages}") instead of
naming one ``input``. The whole chain is checked (tasks exist, options are valid, every input is
defined before it is used and is a kind the step's task takes) before any weights load.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from taskrun.tasks import REGISTRY
from taskrun.tasks.base import TaskError, make_options, to_jsonable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CHAIN_DIR = Path(__file__).resolve().parent.parent / "configs" / "chains"
INPUT_KINDS = ("text", "audio", "image", "path")
_REF = re.compile(r"\{(\w+)\}")


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
    p = Path(name_or_file)
    if not p.is_file():
        p = CHAIN_DIR / f"{name_or_file}.toml"
    if not p.is_file():
        raise TaskError(f"no chain named '{name_or_file}': not a file, and not one of "
                        f"{', '.join(available()) or 'the chains in configs/chains/'}")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(f"{p} is not valid TOML ({exc}); fix the chain file") from None
    return parse_chain(raw, str(p))


def parse_chain(raw: dict, path: str = "") -> Chain:
    where = path or "the chain"
    unknown = set(raw) - {"name", "description", "inputs", "steps"}
    if unknown:
        raise TaskError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a chain has name, "
                        f"description, inputs and [[steps]]")
    inputs = raw.get("inputs") or {}
    if not isinstance(inputs, dict) or not inputs:
        raise TaskError(f"{where}: declare the chain's inputs, e.g. inputs = {{ recording = \"audio\" }}")
    for n, kind in inputs.items():
        if kind not in INPUT_KINDS:
            raise TaskError(f"{where}: input '{n}' has kind '{kind}'; use one of {', '.join(INPUT_KINDS)}")
    steps_raw = raw.get("steps") or []
    if not steps_raw:
        raise TaskError(f"{where}: a chain needs at least one [[steps]] table")
    names = {f.name for f in dataclasses.fields(Step)}
    steps = []
    for i, s in enumerate(steps_raw, 1):
        bad = set(s) - names
        if bad:
            raise TaskError(f"{where}: step {i} has unknown key(s) {', '.join(sorted(bad))}; "
                            f"a step takes {', '.join(sorted(names))}")
        if "task" not in s:
            raise TaskError(f"{where}: step {i} names no task; add task = \"...\"")
        steps.append(Step(**s))
    return Chain(name=raw.get("name") or Path(path).stem, description=raw.get("description", ""),
                 inputs=dict(inputs), steps=steps, path=path)


# --------------------------------------------------------------------------- checking


def check_chain(chain: Chain, values: dict[str, str] | None = None) -> list[Any]:
    """Check the whole chain before anything loads; return each step's Options.

    ``values`` are the chain's input values (used to fill "{name}" in options); without them
    only the wiring is checked.
    """
    kinds: dict[str, str] = dict(chain.inputs)  # every named value so far → its kind
    options = []
    for i, step in enumerate(chain.steps, 1):
        label = f"step {i} ({step.task})"
        task = REGISTRY.get(step.task)
        if task is None:
            raise TaskError(f"chain {chain.name}: {label} names an unknown task; known tasks: "
                            f"{', '.join(REGISTRY)}")
        if (step.input is None) == (step.template is None):
            raise TaskError(f"chain {chain.name}: {label} needs exactly one of input = \"NAME\" or "
                            f"template = \"... {{NAME}} ...\"")
        refs = [step.input] if step.input else _REF.findall(step.template)
        for ref in refs:
            if ref not in kinds:
                raise TaskError(f"chain {chain.name}: {label} reads '{ref}', which no earlier step "
                                f"outputs and is not a chain input ({', '.join(kinds)})")
        kind = kinds[step.input] if step.input else "text"
        if kind == "path" and "text" in task.input_kinds:
            kind = "text"  # a file named by path is read and sniffed at run time
        if kind not in task.input_kinds:
            src = f"'{step.input}'" + (f" ({kind}, from {_producer(chain, step.input)})"
                                       if step.input else "")
            raise TaskError(f"chain {chain.name}: {label} takes {task.takes}, but its input {src} "
                            f"is {kind}; reorder the steps or feed it a {task.input_kinds[0]} value")
        if step.output:
            if task.produces is None:
                raise TaskError(f"chain {chain.name}: {label} declares output '{step.output}', but "
                                f"{step.task} produces nothing a next step can take; remove the output")
            if step.output in kinds:
                raise TaskError(f"chain {chain.name}: {label} output '{step.output}' is already "
                                f"defined; give it another name")
            kinds[step.output] = task.produces
        opts = {k: _fill(v, values) for k, v in step.options.items()}
        try:
            options.append(make_options(task.Options, opts) if values is not None else None)
        except TaskError as exc:
            raise TaskError(f"chain {chain.name}: {label}: {exc}") from None
    return options


def _producer(chain: Chain, name: str) -> str:
    for s in chain.steps:
        if s.output == name:
            return f"the {s.task} step"
    return "a chain input"


def _fill(value: Any, values: dict[str, str] | None) -> Any:
    """Replace "{name}" in a string option with the chain input of that name."""
    if not isinstance(value, str) or values is None:
        return value
    def sub(m):
        if m.group(1) not in values:
            raise TaskError(f"an option refers to '{{{m.group(1)}}}', which is not a chain input "
                            f"({', '.join(values)})")
        return values[m.group(1)]
    return _REF.sub(sub, value)


def bind_inputs(chain: Chain, args: tuple[str, ...]) -> dict[str, str]:
    names = list(chain.inputs)
    if len(args) != len(names):
        usage = " ".join(n.upper() for n in names)
        raise TaskError(f"chain {chain.name} takes {len(names)} input(s): {usage} (got {len(args)})")
    values = dict(zip(names, args))
    for n, v in values.items():
        if chain.inputs[n] in ("audio", "image", "path") and not Path(v).exists():
            raise TaskError(f"chain {chain.name}: input {n.upper()} = {v}: no such file or folder")
        if chain.inputs[n] == "text" and not v.strip():
            raise TaskError(f"chain {chain.name}: input {n.upper()} is empty; give some text")
    return values


# --------------------------------------------------------------------------- running


@dataclass
class ChainRun:
    chain: Chain
    chain_id: str
    out_dir: Path
    records: list[Any] = field(default_factory=list)
    wall_s: float = 0.0
    values: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"chain": self.chain.name, "chain_id": self.chain_id, "wall_s": round(self.wall_s, 4),
                "output_dir": str(self.out_dir), "stages": [r.to_json() for r in self.records]}


def run_chain(chain: Chain, args: tuple[str, ...], out_dir: Path, *, device="auto", dtype="auto",
              offline=False, log=None, printer_for: Callable | None = None,
              on_stage: Callable | None = None) -> ChainRun:
    """Check, then run every step as its own job (one run-log row each, linked by chain id)."""
    from taskrun.runner.jobs import new_id, run_job
    from taskrun.tasks.inputs import file_input, text_input

    values = bind_inputs(chain, args)
    options = check_chain(chain, values)
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    run = ChainRun(chain, new_id(), out_dir, values=dict(values))
    texts: dict[str, list[str]] = {}
    for i, (step, opts) in enumerate(zip(chain.steps, options)):
        task = REGISTRY[step.task]
        if step.template:
            text = _REF.sub(lambda m: "\n\n".join(texts[m.group(1)]) if m.group(1) in texts
                            else values[m.group(1)], step.template)
            inputs = [text_input(text, f"{chain.name} step {i + 1}")]
        elif step.input in texts:
            inputs = [text_input(t, f"{step.input}") for t in texts[step.input]]
        elif chain.inputs[step.input] == "text":
            inputs = [text_input(values[step.input], step.input)]
        else:
            inputs = [file_input(values[step.input])]
        if on_stage:
            on_stage(i, step)
        printer = printer_for(task, opts) if printer_for else None
        try:
            rec = run_job(task, lambda inp=inputs: inp, opts, model=step.model, device=device, dtype=dtype,
                          offline=offline, log=log, on_event=printer, chain_id=run.chain_id, stage=i)
        finally:
            if printer is not None:
                printer.close()
        run.records.append(rec)
        if not rec.items:
            raise TaskError(f"chain {chain.name}: step {i + 1} ({step.task}) produced nothing; "
                            f"see its errors above")
        _write_artifacts(run, i, step, task, rec, texts)
    run.wall_s = time.perf_counter() - t0
    from taskrun.tasks.base import atomic_write

    atomic_write(out_dir / "chain.json", json.dumps(to_jsonable(run.to_json()), ensure_ascii=False, indent=1))
    return run


def _write_artifacts(run: ChainRun, i: int, step: Step, task, rec, texts: dict) -> None:
    """The step's handed-on text (transcript, passages, answer) and its full JSON record."""
    from taskrun.tasks.base import atomic_write

    stem = f"{i + 1}-{step.output or step.task}"
    atomic_write(run.out_dir / f"{stem}.json",
                 json.dumps(to_jsonable(rec.to_json()), ensure_ascii=False, indent=1))
    if task.produces:
        outs = [task.handoff(r) for r in rec.results]
        if step.output:
            texts[step.output] = outs
        atomic_write(run.out_dir / (step.artifact or f"{stem}.txt"), "\n\n".join(outs).rstrip() + "\n")


def default_out_dir(chain: Chain) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("taskrun-out") / f"{chain.name}-{stamp}"
    d, n = base, 1
    while d.exists():
        n += 1
        d = Path(f"{base}-{n}")
    return d
