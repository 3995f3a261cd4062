"""search: a query → the most similar passages of a corpus of text files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from taskrun.tasks.base import Task, metric, option, require


@dataclass(frozen=True)
class Options:
    corpus: str = option(
        "", "--corpus", path=True, help="A text/markdown file or a folder of them to search.", metavar="FILE|DIR"
    )
    top_k: int = option(5, "-k", "--top-k", help="How many passages to return per query.")
    passage_chars: int = option(
        500, "--passage-chars", help="Longest passage, in characters; paragraphs are split or joined to fit."
    )
    batch_size: int = option(64, "--batch-size", help="Passages per forward pass when embedding the corpus.")

    def __post_init__(self):
        require(bool(self.corpus), "search needs a corpus: --corpus FILE|DIR")
        require(Path(self.corpus).exists(), f"--corpus {self.corpus}: no such file or folder")
        require(self.top_k > 0, f"--top-k must be at least 1 (got {self.top_k})")
        require(self.passage_chars >= 50, f"--passage-chars must be at least 50 (got {self.passage_chars})")
        require(self.batch_size > 0, f"--batch-size must be at least 1 (got {self.batch_size})")


@dataclass
class Hit:
    score: float  # cosine similarity to the query
    text: str
    file: str
    line_start: int  # 1-based, inclusive
    line_end: int


@dataclass
class Result:
    query: str
    hits: list[Hit] = field(default_factory=list)

    def summary(self) -> str:
        best = self.hits[0] if self.hits else None
        return f"{self.query[:40]!r} → {best.file}:{best.line_start} ({best.score:.3f})" if best else "no hits"


@dataclass
class Metrics:
    items: int = metric("queries", 0)
    passages: int = metric("passages in the corpus", 0)
    embedded_passages: int = metric("passages embedded in this run: those of new and changed files", 0)
    reused_passages: int = metric("passages whose vectors came from the search index (unchanged files)", 0)
    corpus_cached: bool = metric("nothing was embedded: every file was unchanged in the search index", False)
    files: int = metric("files in the corpus", 0)
    files_embedded: int = metric("files new or changed since the index last saw them", 0)
    files_dropped: int = metric("files gone from the corpus since, dropped from the index", 0)
    index_s: float = metric(
        "reading + hashing the corpus files, splitting and embedding the new and changed ones, and updating the index"
    )
    query_s: float = metric("embedding the queries and ranking the passages")
    items_per_s: float = metric("queries ÷ query_s")


class SearchTask(Task):
    def render(self, result: Result, options) -> str:
        lines = [f"query: {result.query}"]
        for rank, h in enumerate(result.hits, 1):
            snippet = " ".join(h.text.split())
            snippet = snippet if len(snippet) <= 300 else snippet[:299] + "…"
            lines.append(f"{rank:>2}. {h.score:.3f}  {h.file}:{h.line_start}-{h.line_end}\n    {snippet}")
        return "\n".join(lines)

    def handoff(self, result: Result) -> str:
        return "\n\n".join(f"[{i}] ({h.file}:{h.line_start}) {h.text}" for i, h in enumerate(result.hits, 1))


TASK = SearchTask(
    name="search",
    summary="Find the passages of a corpus (text/markdown files) most similar to a query.",
    takes="queries as text (arguments, -f file, stdin) and --corpus FILE|DIR",
    returns="per query, the top-k passages with cosine scores and file:line locations",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("text",),
    model_kinds="a sentence-embedding model such as minilm",
    produces="text",
)
