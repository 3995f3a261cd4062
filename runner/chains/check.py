"""A chain checked before any weights load: every task exists, its options are valid, every input
is defined before it is used and is a kind the step's task takes; and the chain's inputs bound to
the command's arguments. The chain file's own shape is file.py's; running it is run.py's.
"""

from __future__ import annotations

import re
from typing import Any

from taskrun.runner.chains.file import Chain, _typed_options
from taskrun.runner.output.terminal import for_terminal
from taskrun.tasks import REGISTRY
from taskrun.tasks.base import TaskError, make_options
from taskrun.tasks.inputs import is_path

REF = re.compile(r"\{(\w+)\}")


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
            raise TaskError(f"chain {chain.name}: {label} names an unknown task; known tasks: {', '.join(REGISTRY)}")
        if (step.input is None) == (step.template is None):
            raise TaskError(
                f'chain {chain.name}: {label} needs exactly one of input = "NAME" or template = "... {{NAME}} ..."'
            )
        refs = [step.input] if step.input else REF.findall(step.template)
        for ref in refs:
            if ref not in kinds:
                raise TaskError(
                    f"chain {chain.name}: {label} reads '{ref}', which no earlier step "
                    f"outputs and is not a chain input ({', '.join(kinds)})"
                )
        kind = kinds[step.input] if step.input else "text"
        if kind == "path" and "text" in task.input_kinds:
            kind = "text"  # a file named by path is read and sniffed at run time
        if kind not in task.input_kinds:
            src = f"'{step.input}'" + (f" ({kind}, from {_producer(chain, step.input)})" if step.input else "")
            raise TaskError(
                f"chain {chain.name}: {label} takes {task.takes}, but its input {src} "
                f"is {kind}; reorder the steps or feed it a {task.input_kinds[0]} value"
            )
        if step.output:
            if task.produces is None:
                raise TaskError(
                    f"chain {chain.name}: {label} declares output '{step.output}', but "
                    f"{step.task} produces nothing a next step can take; remove the output"
                )
            if step.output in kinds:
                raise TaskError(
                    f"chain {chain.name}: {label} output '{step.output}' is already defined; give it another name"
                )
            kinds[step.output] = task.produces
        where = f"chain {chain.name}" + (f" ({for_terminal(chain.path, 200)})" if chain.path else "")
        opts = _typed_options(task, {k: _fill(v, values) for k, v in step.options.items()}, f"{where}: {label}")
        try:
            options.append(make_options(task.Options, opts) if values is not None else None)
        except TaskError as exc:
            raise TaskError(f"{where}: {label}: {exc}") from None
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
            raise TaskError(f"an option refers to '{{{m.group(1)}}}', which is not a chain input ({', '.join(values)})")
        return values[m.group(1)]

    return REF.sub(sub, value)


def bind_inputs(chain: Chain, args: tuple[str, ...]) -> dict[str, str]:
    names = list(chain.inputs)
    if len(args) != len(names):
        usage = " ".join(n.upper() for n in names)
        raise TaskError(f"chain {chain.name} takes {len(names)} input(s): {usage} (got {len(args)})")
    values = dict(zip(names, args))
    for n, v in values.items():
        if chain.inputs[n] in ("audio", "image", "path") and not is_path(v):
            raise TaskError(f"chain {chain.name}: input {n.upper()} = {for_terminal(v, 200)}: no such file or folder")
        if chain.inputs[n] == "text" and not v.strip():
            raise TaskError(f"chain {chain.name}: input {n.upper()} is empty; give some text")
    return values
