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

This is the only chain engine: a task command's ``--then`` builds its chain in code (then_chain)
and runs it through the same run_steps as a chain file does.
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

from taskrun.runner.jobs import new_id, run_job
from taskrun.tasks import REGISTRY, get_task
from taskrun.tasks.base import Input, Task, TaskError, atomic_write, make_options, to_jsonable
from taskrun.tasks.inputs import file_input, text_input

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

# A code-built step (``--then``) reads every result of the step before it, one input each, named
# "<task> of <input>". Not a name a chain file can define, so check_chain refuses it there.
PREVIOUS = "<previous step>"


class NothingProduced(TaskError):
    """A step ended with no results (every input failed): there is nothing to hand on."""


class StageView:
    """What a front door shows while a chain runs, step by step. This one shows nothing."""

    def begin(self, i: int, step: Step) -> None:
        """Step ``i`` is about to run: its inputs are ready."""

    def printer(self, i: int, task: Task) -> Any:
        """The event printer for step ``i``'s job, or None; its ``options`` are set when made."""
        return None

    def done(self, i: int, step: Step, rec: Any) -> None:
        """Step ``i``'s job finished (possibly with no results; the chain stops after this)."""


@dataclass
class FirstStep:
    """The first step's job as a task command runs it: inputs and options are made inside the job
    (so a bad input or option is logged as that job's failure), on the runtime the user named."""

    inputs: Callable[[], list[Input]]
    options: Callable[[], Any]
    runtime: str | None = None


@dataclass
class ChainRun:
    chain: Chain
    chain_id: str | None  # None: a lone task command, logged as a job of no chain
    out_dir: Path | None  # None: nothing is written to disk
    records: list[Any] = field(default_factory=list)
    wall_s: float = 0.0
    values: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)  # named outputs so far

    def to_json(self) -> dict:
        return {"chain": self.chain.name, "chain_id": self.chain_id, "wall_s": round(self.wall_s, 4),
                "output_dir": str(self.out_dir), "stages": [r.to_json() for r in self.records]}


def then_chain(task: Task, specs: tuple[str, ...], model: str | None = None) -> Chain:
    """The chain of a task command: ``task``, then each ``--then TASK[=MODEL]`` fed the results of
    the step before it. Checked before anything loads."""
    steps = [Step(task=task.name, model=model)]
    nexts = []
    for spec in specs:
        name, _, next_model = spec.partition("=")  # --then summarize or --then summarize=MODEL
        nexts.append(get_task(name))
        steps.append(Step(task=name, input=PREVIOUS, model=next_model or None))
    prev = task
    for nxt in nexts:
        if prev.produces is None or prev.produces not in nxt.input_kinds:
            raise TaskError(f"{prev.name} cannot feed {nxt.name}: {prev.name} produces "
                            f"{prev.produces or 'nothing a task takes'}, {nxt.name} takes {nxt.takes}")
        prev = nxt
    return Chain(name=" then ".join(s.task for s in steps), description="", inputs={}, steps=steps)


def run_chain(chain: Chain, args: tuple[str, ...], out_dir: Path, *, device="auto", dtype="auto",
              offline=False, log=None, view: StageView | None = None) -> ChainRun:
    """Check, then run every step as its own job (one run-log row each, linked by chain id),
    writing each step's output and the whole run (chain.json) to ``out_dir``."""
    values = bind_inputs(chain, args)
    options = check_chain(chain, values)
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    run = ChainRun(chain, new_id(), out_dir, values=dict(values))
    run_steps(run, view or StageView(), options, device=device, dtype=dtype, offline=offline, log=log)
    run.wall_s = time.perf_counter() - t0
    atomic_write(out_dir / "chain.json", json.dumps(to_jsonable(run.to_json()), ensure_ascii=False, indent=1))
    return run


def run_steps(run: ChainRun, view: StageView, options: list | None = None, *,
              first: FirstStep | None = None, device="auto", dtype="auto", offline=False,
              log=None) -> ChainRun:
    """Run ``run.chain``'s steps in order, each a job of its own (its run-log row carries the
    chain id and its stage number), each fed from the chain's inputs or earlier steps' results.

    ``options[i]`` are step i's Options (default: made from the step's ``options``); ``first``
    feeds step 0 as a task command does. Raises NothingProduced when a step has no results.
    """
    for i, step in enumerate(run.chain.steps):
        task = REGISTRY[step.task]
        if i == 0 and first is not None:
            get_inputs, opts, runtime = first.inputs, first.options, first.runtime
        else:
            inputs = _step_inputs(run, i, step, task)
            get_inputs, runtime = (lambda inp=inputs: inp), None
            opts = options[i] if options is not None else make_options(task.Options, step.options)
        view.begin(i, step)
        printer = view.printer(i, task)
        try:
            rec = run_job(task, get_inputs, _shown_to(printer, opts), model=step.model, runtime=runtime,
                          device=device, dtype=dtype, offline=offline, log=log, on_event=printer,
                          chain_id=run.chain_id, stage=None if run.chain_id is None else i)
        finally:
            if printer is not None:
                printer.close()
        run.records.append(rec)
        view.done(i, step, rec)
        if not rec.items:
            raise NothingProduced(f"chain {run.chain.name}: step {i + 1} ({step.task}) produced "
                                  f"nothing; see its errors above")
        _keep(run, i, step, task, rec)
    return run


def _shown_to(printer: Any, options: Any) -> Callable[[], Any]:
    """The job's Options maker; the printer renders with the Options once they are made."""
    def make():
        made = options() if callable(options) else options
        if printer is not None:
            printer.options = made
        return made
    return make


def _step_inputs(run: ChainRun, i: int, step: Step, task: Task) -> list[Input]:
    if step.input == PREVIOUS:
        return handoff(run.records[-1], task)
    if step.template:
        text = _REF.sub(lambda m: "\n\n".join(run.texts[m.group(1)]) if m.group(1) in run.texts
                        else run.values[m.group(1)], step.template)
        return [text_input(text, f"{run.chain.name} step {i + 1}")]
    if step.input in run.texts:
        return [text_input(t, f"{step.input}") for t in run.texts[step.input]]
    if run.chain.inputs[step.input] == "text":
        return [text_input(run.values[step.input], step.input)]
    return [file_input(run.values[step.input])]


def handoff(rec: Any, nxt: Task) -> list[Input]:
    """A finished job's results as ``nxt``'s inputs: one text per result, in input order."""
    prev = REGISTRY[rec.task]
    inputs = [Input(source=f"{rec.task} of {it.source}", kind=nxt.input_kinds[0],
                    text=prev.handoff(it.result))
              for it in sorted(rec.items, key=lambda x: x.index)]
    empty = [h.source for h in inputs if not (h.text or "").strip()]
    if empty:
        raise TaskError(f"{rec.task} produced no text to hand to {nxt.name} ({', '.join(empty)}); "
                        f"nothing to {nxt.name}")
    return inputs


def _keep(run: ChainRun, i: int, step: Step, task: Task, rec: Any) -> None:
    """The step's handed-on text under its output name and, with an output folder, its
    artifacts there: that text (transcript, passages, answer) and the job's full JSON record."""
    if not step.output and run.out_dir is None:
        return
    outs = [task.handoff(r) for r in rec.results] if task.produces else None
    if outs is not None and step.output:
        run.texts[step.output] = outs
    if run.out_dir is None:
        return
    stem = f"{i + 1}-{step.output or step.task}"
    atomic_write(run.out_dir / f"{stem}.json",
                 json.dumps(to_jsonable(rec.to_json()), ensure_ascii=False, indent=1))
    if outs is not None:
        atomic_write(run.out_dir / (step.artifact or f"{stem}.txt"), "\n\n".join(outs).rstrip() + "\n")


def default_out_dir(chain: Chain) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("taskrun-out") / f"{chain.name}-{stamp}"
    d, n = base, 1
    while d.exists():
        n += 1
        d = Path(f"{base}-{n}")
    return d
