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


# -o suffixes embed writes: the job's JSON, and the vectors in the formats other tools read.
VECTOR_FORMATS = ("npy", "jsonl", "parquet", "csv")
OUTPUT_SUFFIXES = ("json",) + VECTOR_FORMATS


class EmbedTask(Task):
    def render(self, result: Embedding, options) -> str:
        head = ", ".join(f"{x:.4f}" for x in result.vector[:4])
        cut = " [truncated]" if result.truncated else ""
        return f"[{head}, …] ({len(result.vector)}-d){cut}  {result.text[:60]}"

    def check_output(self, output: str, fmt: str | None) -> None:
        """Refuse an -o file embed cannot fill with vectors, before any model loads: a .txt or
        .tsv would get the display above (four numbers and an ellipsis), not the vectors."""
        suffix = Path(output).suffix.lower().lstrip(".")
        if suffix not in OUTPUT_SUFFIXES:
            raise TaskError(
                f"embed writes vectors to .npy, .jsonl, .parquet or .csv files (or the "
                f"job as .json), not '{Path(output).name}'; name the output e.g. "
                f"{Path(output).stem or 'vectors'}.npy"
            )
        if fmt in VECTOR_FORMATS and suffix != fmt:
            raise TaskError(
                f"--format {fmt} and -o {Path(output).name} disagree; name the output "
                f"{Path(output).stem or 'vectors'}.{fmt}, or drop --format"
            )

    def write(self, items: list[Embedding], fmt: str, path: Path | None, options) -> str | bytes | None:
        if fmt not in VECTOR_FORMATS:
            return super().write(items, fmt, path, options)
        if path is None and fmt in ("npy", "parquet"):
            raise TaskError(f"--format {fmt} writes a binary file; give one with -o vectors.{fmt}")
        from taskrun.tasks import vector_files

        return getattr(vector_files, f"to_{fmt}")([it.text for it in items], [it.vector for it in items])


TASK = EmbedTask(
    name="embed",
    summary="Turn texts into vectors (for similarity, search, clustering).",
    takes="texts: arguments, a file with one text per line (-f), or stdin",
    returns="one vector per text (L2-normalised by default); --json gives them; -o FILE.npy, .jsonl, "
    ".parquet or .csv saves them for other tools",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("text",),
    model_kinds="a sentence-embedding model such as minilm",
    formats=("text", "json") + VECTOR_FORMATS,
)
