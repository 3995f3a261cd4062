"""The pipeline contract: what every pipeline is built with and what its run yields.

A Pipeline is built once per (task, model, runtime, device, dtype) with the weights loaded, then
called per job: ``run(inputs, options, clock)`` yields the events of ``tasks/events.py``, ending
with ``Done(metrics)``. The runner owns inference mode, timing of the load and the run log.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from taskrun.pipelines.device import resolve_device
from taskrun.tasks.base import Input, ModelCard
from taskrun.tasks.clock import Clock


class Pipeline:
    task: str = ""
    runtime: str = ""

    def __init__(self, card: ModelCard, device: str = "auto", dtype: str = "auto") -> None:
        self.card = card
        self.device = resolve_device(device)
        self.dtype = dtype  # a pipeline sets the dtype it actually chose during load

    def run(self, inputs: list[Input], options: Any, clock: Clock) -> Iterator[Any]:
        raise NotImplementedError


class EnginePipeline(Pipeline):
    """A task's logic over an engine (a text encoder, a language model, a speech model): the
    RUNTIMES row names the engine class, the engine loads the weights (cached per model, runtime,
    device and dtype) and resolves its own device, and the run reports what it chose."""

    def __init__(self, card: ModelCard, device: str = "auto", dtype: str = "auto", *, engine: type) -> None:
        self.card = card
        self.engine = engine.load(card, device, dtype)
        self.runtime, self.device, self.dtype = self.engine.runtime, self.engine.device, self.engine.dtype
