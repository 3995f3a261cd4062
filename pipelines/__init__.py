"""HOW each task runs: one module per (task, runtime), named ``pipelines/<task>_<runtime>.py``,
each defining a ``Pipeline`` class (see ``pipelines/base.py``).

Loaded models are cached in-process by (model digest, runtime, device, dtype), so a chain or a
batch that uses one model twice reads its weights once.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from tasks.base import ModelCard, TaskError

_MODELS: dict[tuple, Any] = {}


def pipeline_module(task: str, runtime: str):
    name = f"pipelines.{task.replace('-', '_')}_{runtime.replace('-', '_')}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:  # a missing dependency inside the module, not a missing module
            raise TaskError(f"the {runtime} runtime for {task} needs the Python package "
                            f"`{exc.name}`: pip install {exc.name}") from None
        raise TaskError(f"{task} has no {runtime} runtime") from None


def load_pipeline(task: str, card: ModelCard, runtime: str, device: str, dtype: str):
    """A ready Pipeline for ``task`` on ``card``; the weights come from the cache when loaded before."""
    if runtime not in card.runtimes:
        raise TaskError(f"`{card.name}` runs on {', '.join(card.runtimes)}, not {runtime}; "
                        f"pick one of those with --runtime")
    module = pipeline_module(task, runtime)
    return module.Pipeline(card, device=device, dtype=dtype)


def cached_model(card: ModelCard, runtime: str, device: str, dtype: str, role: str,
                 factory: Callable[[], Any]) -> Any:
    """Load once per (model, runtime, device, dtype, role); ``role`` separates e.g. a model and its
    tokenizer, or two heads of one checkpoint."""
    key = (card.digest, card.path, runtime, device, dtype, role)
    if key not in _MODELS:
        _MODELS[key] = factory()
    return _MODELS[key]


def clear_cache() -> None:
    _MODELS.clear()
