"""Typed events that a pipeline yields while it runs; the runner renders them.

A pipeline's ``run`` is a generator: zero or more progress events, one ``Item`` or
``ItemError`` per input (in any order, each with its index), then exactly one ``Done``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Token:
    """A piece of streamed text (generate, summarize)."""

    text: str
    index: int = 0  # which input it belongs to


@dataclass(frozen=True)
class Partial:
    """A piece of a result that is ready before the whole item (a transcript segment)."""

    value: Any
    index: int = 0


@dataclass(frozen=True)
class Step:
    """One denoising step (image) or other fixed-count loop step finished."""

    step: int  # 1-based
    total: int
    seconds: float  # this step's time


@dataclass(frozen=True)
class Progress:
    """Work done so far, in ``unit`` (items, audio seconds, passages)."""

    done: float
    total: float | None
    unit: str = "items"
    label: str = ""


@dataclass(frozen=True)
class Notice:
    """Something the user should know that is not an error: the runner prints it on stderr as one
    line and keeps it with the job (its JSON and run-log row). A model switched for the speech's
    language, a damaged cache rebuilt. ``partial``: an item's result is incomplete (a recording
    cut short was transcribed as far as it goes): the job's status becomes ``partial``."""

    message: str
    partial: bool = False


@dataclass(frozen=True)
class Item:
    """One input's finished result."""

    index: int
    source: str
    result: Any


@dataclass(frozen=True)
class ItemError:
    """One input failed; the rest of the batch goes on."""

    index: int
    source: str
    message: str

    def describe(self) -> str:
        """The message, naming its input once (many messages already start with their file)."""
        return self.message if self.message.startswith(self.source) else f"{self.source}: {self.message}"


@dataclass(frozen=True)
class Done:
    """The job's task-specific metrics; always the last event."""

    metrics: Any
