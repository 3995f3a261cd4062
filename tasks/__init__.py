"""The task registry: a plain dict, task name → Task. `run tasks` prints it.

Adding a task: write ``tasks/<name>.py`` with a ``TASK`` object and ``pipelines/<name>_<runtime>.py``
with a ``Pipeline`` class, then add one line below.
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


# Which task to suggest for an input of a given kind when the user picked one that does not fit.
_FOR_KIND = {"audio": "transcribe", "image": "classify", "text": "embed"}


def suggest_task(kind: str) -> str | None:
    name = _FOR_KIND.get(kind)
    return name if name in REGISTRY else None
