"""What generate and summarize share above the engine: loading it, and the per-input failure policy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from taskrun.pipelines.base import EnginePipeline
from taskrun.pipelines.llm.engine import LLMEngine
from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, TaskError


class LLMPipeline(EnginePipeline):
    """A task on any :class:`LLMEngine`: the engine class comes from the RUNTIMES row."""

    engine: LLMEngine

    def engine_notes(self) -> Iterator[ev.Notice]:
        """The engine's notes (e.g. no float16 prompt copy: prompts read otherwise), one Notice each,
        for every job that ran so; an engine without notes has none."""
        for note in getattr(self.engine, "notes", ()):
            yield ev.Notice(note)

    def draft_notes(self, stopped: int, answers: int) -> Iterator[ev.Notice]:
        """Say so where the adaptive draft stopped (speculative.py): the user asked for speed."""
        if stopped:
            yield ev.Notice(
                f"the draft stopped early in {stopped} of {answers} answer(s): speculation was slower here "
                "than the model alone, so the rest was decoded without it (docs/language-models.md, "
                "speculative decoding); --draft none skips loading it, --draft-tokens N drafts throughout"
            )


def per_input(inputs: list[Input], one: Callable[[int, Input], Iterator[Any]]) -> Iterator[Any]:
    """For each input, yield the events of ``one(index, input)`` (a generator that returns the
    result), then its ``Item``; an input that fails becomes its ``ItemError`` and the rest go on
    (the runner decides what a failed input means for the job)."""
    for i, inp in enumerate(inputs):
        try:
            result = yield from one(i, inp)
        except TaskError as exc:
            yield ev.ItemError(i, inp.source, str(exc))
            continue
        yield ev.Item(i, inp.source, result)
