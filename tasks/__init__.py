"""The task registry: a plain dict, task name → Task. `run tasks` prints it.

Adding a task: write ``tasks/<name>.py`` with a ``TASK`` object and add one line below; the
docs/layout.md's "Adding a task" names the other files (pipeline, table row, architecture rule, default
model, tiny test model).
"""

from __future__ import annotations

import importlib

from taskrun.tasks.base import Task, TaskError

_MODULES = {
    "embed": "taskrun.tasks.embed",
    "search": "taskrun.tasks.search",
    "classify": "taskrun.tasks.classify",
    "generate": "taskrun.tasks.generate",
    "summarize": "taskrun.tasks.summarize",
    "detect": "taskrun.tasks.detect",
    "transcribe": "taskrun.tasks.transcribe",
    "image": "taskrun.tasks.image",
}

REGISTRY: dict[str, Task] = {name: importlib.import_module(mod).TASK for name, mod in _MODULES.items()}


def get_task(name: str) -> Task:
    try:
        return REGISTRY[name]
    except KeyError:
        raise TaskError(f"no task named '{name}'; `run tasks` lists them: {', '.join(REGISTRY)}") from None
