"""embed: texts → vectors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskrun.tasks.base import Task, TaskError, metric, option, require


@dataclass(frozen=True)
class Options:
    batch_size: int = option(64, "--batch-size", help="Texts per forward pass (sorted by length first).")
    normalize: bool = option(True, "--normalize", help="L2-normalise vectors (cosine = dot product).")

    def __post_init__(self):
        require(self.batch_size > 0, f"--batch-size must be at least 1 (got {self.batch_size})")


@dataclass
class Embedding:
    text: str
    vector: Any  # numpy float32 array, shape (dim,)
    tokens: int  # tokens the model read (after truncation)
    truncated: bool = False  # the text was longer than the model's window and was cut

    def summary(self) -> str:
        return f"{len(self.vector)}-d {self.text[:40]!r}"


Result = Embedding


@dataclass
class Metrics:
    items: int = metric("texts embedded", 0)
    input_tokens: int = metric("tokens read by the model, padding excluded", 0)
    items_per_s: float = metric("items ÷ time in tokenise + forward + pooling (load excluded)")
    dim: int = metric("vector length", 0)


class EmbedTask(Task):
    def render(self, result: Embedding, options) -> str:
        head = ", ".join(f"{x:.4f}" for x in result.vector[:4])
        cut = " [truncated]" if result.truncated else ""
        return f"[{head}, …] ({len(result.vector)}-d){cut}  {result.text[:60]}"

    def write(self, items: list[Embedding], fmt: str, path: Path | None, options) -> str | bytes | None:
        if fmt != "npy":
            return super().write(items, fmt, path, options)
        if path is None:
            raise TaskError("--format npy writes a binary array; give a file with -o vectors.npy")
        import io

        import numpy as np

        buf = io.BytesIO()
        np.save(buf, np.stack([it.vector for it in items]).astype(np.float32))
        return buf.getvalue()


TASK = EmbedTask(
    name="embed",
    summary="Turn texts into vectors (for similarity, search, clustering).",
    takes="texts: arguments, a file with one text per line (-f), or stdin",
    returns="one vector per text (L2-normalised by default); --json gives them, -o FILE.npy saves an array",
    Options=Options, Result=Result, Metrics=Metrics,
    input_kinds=("text",),
    model_kinds="a sentence-embedding model such as minilm",
    formats=("text", "json", "npy"),
)
