"""taskrun from Python: name the task, get its typed result and honest numbers.

    import taskrun
    t = taskrun.run("transcribe", "meeting.wav")      # a Transcript, with .metrics and .run_id
    for event in taskrun.stream("generate", "Hi", max_tokens=20): ...
    llm = taskrun.load("generate")                    # a warm handle: llm.run(...), llm.stream(...)
    taskrun.tasks()                                   # what `run tasks --json` lists

The same checks, errors (``taskrun.TaskError``, whose message names the fix), metrics and run-log
rows as the ``run`` command; see docs/python-api.md. Importing this package imports nothing else:
each name loads its module on first use, so ``import taskrun`` stays cheap (no torch).

This folder holds only this file: the rest of the package is mapped from the repository's
top-level folders (runner/ → taskrun.runner, ...) by pyproject.toml.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__version__ = "0.1.0"

_NAMES = {
    "run": "taskrun.runner.api",
    "stream": "taskrun.runner.api",
    "load": "taskrun.runner.api",
    "Model": "taskrun.runner.api",
    "Results": "taskrun.runner.api",
    "RunMetrics": "taskrun.runner.api",
    "JobInfo": "taskrun.runner.api",
    "Stream": "taskrun.runner.api",
    "UnfinishedJob": "taskrun.runner.api",
    "TaskError": "taskrun.tasks.base",
    "events": "taskrun.tasks.events",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _NAMES:
        raise AttributeError(f"module 'taskrun' has no attribute {name!r}")
    module = importlib.import_module(_NAMES[name])
    value = module if name == "events" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES, "tasks"])


class _Tasks:
    """``taskrun.tasks``: called, what `run tasks --json` lists; otherwise the ``taskrun.tasks``
    subpackage (the task registry), whose attributes it passes through. Both share one name, so
    the name is this object, which the import system cannot replace (see ``_Package``)."""

    def __call__(self) -> list[dict]:
        """Each task: what it takes, its options, what it returns and measures, its default models."""
        from taskrun.runner.api import tasks

        return tasks()

    def __getattr__(self, name: str) -> Any:
        import importlib

        return getattr(importlib.import_module("taskrun.tasks"), name)

    def __repr__(self) -> str:
        return "<taskrun.tasks(): the task registry; call it for what `run tasks` lists>"


class _Package(types.ModuleType):
    """This module's type: importing the subpackage ``taskrun.tasks`` sets the attribute
    ``tasks`` on its parent, which would shadow the function ``taskrun.tasks()``; here that
    assignment is kept aside and the name stays the callable ``_Tasks``."""

    @property
    def tasks(self) -> _Tasks:
        return _TASKS

    @tasks.setter
    def tasks(self, module: types.ModuleType) -> None:
        self.__dict__["_tasks_package"] = module


_TASKS = _Tasks()
sys.modules[__name__].__class__ = _Package
