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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrun.runner.chains.check import REF, bind_inputs, check_chain
from taskrun.runner.chains.file import (  # noqa: F401
    CHAIN_DIR,
    INPUT_KINDS,
    Chain,
    Step,
    _typed_options,
    available,
    load_chain,
    parse_chain,
)
from taskrun.runner.jobs import new_id, run_job
from taskrun.runner.output.paths import check_writable_folder, confine
from taskrun.runner.output.terminal import for_terminal
from taskrun.tasks import REGISTRY, get_task
from taskrun.tasks.base import (
    Input,
    Task,
    TaskError,
    atomic_write,
    make_options,
    to_jsonable,
)
from taskrun.tasks.inputs import file_input, text_input

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
        return {
            "chain": self.chain.name,
            "chain_id": self.chain_id,
            "wall_s": round(self.wall_s, 4),
            "output_dir": str(self.out_dir),
            "stages": [r.to_json() for r in self.records],
        }


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
            raise TaskError(
                f"{prev.name} cannot feed {nxt.name}: {prev.name} produces "
                f"{prev.produces or 'nothing a task takes'}, {nxt.name} takes {nxt.takes}"
            )
        prev = nxt
    return Chain(name=" then ".join(s.task for s in steps), description="", inputs={}, steps=steps)


def allow_partial(chain: Chain) -> Chain:
    """``chain`` with --allow-partial given to every step whose task takes it (transcribe: a
    recording cut short), over what the chain file sets."""

    def takes(step: Step) -> bool:
        task = REGISTRY.get(step.task)
        return task is not None and any(f.name == "allow_partial" for f in dataclasses.fields(task.Options))

    steps = [
        dataclasses.replace(s, options={**s.options, "allow_partial": True}) if takes(s) else s for s in chain.steps
    ]
    return dataclasses.replace(chain, steps=steps)


def partial_steps(run: ChainRun) -> str | None:
    """The one-line error for steps whose results are partial (a recording cut short, transcribed
    as far as it goes) and were not accepted with --allow-partial; None when there are none. As a
    task command does, the chain still ran on them and wrote its artifacts: the exit status says it."""
    cut = [(i, r) for i, r in enumerate(run.records, 1) if r.partial_not_accepted]
    if not cut:
        return None
    steps = "; ".join(f"step {i} ({r.task}) gave {r.partial_not_accepted} partial result(s)" for i, r in cut)
    return f"chain {run.chain.name}: {steps} (see the warnings above); pass --allow-partial to accept them"


def run_chain(
    chain: Chain,
    args: tuple[str, ...],
    out_dir: Path,
    *,
    device="auto",
    dtype="auto",
    offline=False,
    log=None,
    view: StageView | None = None,
) -> ChainRun:
    """Check, then run every step as its own job (one run-log row each, linked by chain id),
    writing each step's output and the whole run (chain.json) to ``out_dir``."""
    values = bind_inputs(chain, args)
    options = check_chain(chain, values)
    t0 = time.perf_counter()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TaskError(
            f"cannot make the output folder {for_terminal(str(out_dir), 200)} "
            f"({exc.strerror or exc}); pick another with -o"
        ) from None
    check_writable_folder(out_dir, "cannot write the chain's artifacts")
    for i, step in enumerate(chain.steps, 1):  # before any model loads, not after the work
        if step.artifact:
            confine(out_dir, step.artifact, f"{for_terminal(chain.path, 200) or chain.name}: step {i} artifact")
    run = ChainRun(chain, new_id(), out_dir, values=dict(values))
    run_steps(run, view or StageView(), options, device=device, dtype=dtype, offline=offline, log=log)
    run.wall_s = time.perf_counter() - t0
    _artifact(run, out_dir / "chain.json", json.dumps(to_jsonable(run.to_json()), ensure_ascii=False, indent=1))
    return run


def run_steps(
    run: ChainRun,
    view: StageView,
    options: list | None = None,
    *,
    first: FirstStep | None = None,
    device="auto",
    dtype="auto",
    offline=False,
    log=None,
) -> ChainRun:
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
            rec = run_job(
                task,
                get_inputs,
                _shown_to(printer, opts),
                model=step.model,
                runtime=runtime,
                device=device,
                dtype=dtype,
                offline=offline,
                log=log,
                on_event=printer,
                chain_id=run.chain_id,
                stage=None if run.chain_id is None else i,
            )
        finally:
            if printer is not None:
                printer.close()
        run.records.append(rec)
        view.done(i, step, rec)
        if not rec.items:
            raise NothingProduced(
                f"chain {run.chain.name}: step {i + 1} ({step.task}) produced nothing; see its errors above"
            )
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
        text = REF.sub(
            lambda m: "\n\n".join(run.texts[m.group(1)]) if m.group(1) in run.texts else run.values[m.group(1)],
            step.template,
        )
        return [text_input(text, f"{run.chain.name} step {i + 1}")]
    if step.input in run.texts:
        return [text_input(t, f"{step.input}") for t in run.texts[step.input]]
    if run.chain.inputs[step.input] == "text":
        return [text_input(run.values[step.input], step.input)]
    return [file_input(run.values[step.input])]


def handoff(rec: Any, nxt: Task) -> list[Input]:
    """A finished job's results as ``nxt``'s inputs: one text per result, in input order."""
    prev = REGISTRY[rec.task]
    inputs = [
        Input(source=f"{rec.task} of {it.source}", kind=nxt.input_kinds[0], text=prev.handoff(it.result))
        for it in sorted(rec.items, key=lambda x: x.index)
    ]
    empty = [h.source for h in inputs if not (h.text or "").strip()]
    if empty:
        raise TaskError(
            f"{rec.task} produced no text to hand to {nxt.name} ({', '.join(empty)}); nothing to {nxt.name}"
        )
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
    _artifact(run, run.out_dir / f"{stem}.json", json.dumps(to_jsonable(rec.to_json()), ensure_ascii=False, indent=1))
    if outs is not None:
        where = f"{for_terminal(run.chain.path, 200) or run.chain.name}: step {i + 1} artifact"
        target = confine(run.out_dir, step.artifact, where) if step.artifact else run.out_dir / f"{stem}.txt"
        _artifact(run, target, "\n\n".join(outs).rstrip() + "\n")


def default_out_dir(chain: Chain) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("taskrun-out") / f"{chain.name}-{stamp}"
    d, n = base, 1
    while d.exists():
        n += 1
        d = Path(f"{base}-{n}")
    return d


def _artifact(run: ChainRun, target: Path, text: str) -> None:
    """Write one artifact; a folder removed or a disk filled while the chain ran is a clear error
    (the stages that ran are in the run log under the chain id, and were shown as they ran)."""
    try:
        from taskrun.runner.output.safe import check_target

        target.parent.mkdir(parents=True, exist_ok=True)
        check_target(target, what="chain artifact")
        atomic_write(target, text)
    except (OSError, TaskError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise TaskError(
            f"could not write {for_terminal(str(target), 200)} ({why}); the stages that ran "
            f"are in the run log (chain id {run.chain_id})"
        ) from None
