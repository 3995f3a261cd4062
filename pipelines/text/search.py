"""search on any text-encoder engine: split a corpus into passages, embed them once, rank by cosine.

Corpus vectors are cached on disk keyed by the model digest and the corpus content hash (plus the
splitting settings), so a second search over an unchanged corpus embeds only the query.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taskrun.models.resolve import cache_dir
from taskrun.pipelines.text.encoder import EncoderPipeline, encode
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.inputs import read_text_file, sniff
from taskrun.tasks.search import Hit, Metrics, Result

CORPUS_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".text", ""}
SPLITTER_VERSION = 1  # bump when split_passages changes, so old caches are not reused


@dataclass
class Passage:
    file: str
    line_start: int
    line_end: int
    text: str


class SearchPipeline(EncoderPipeline):
    task = "search"

    def run(self, inputs, options, clock):
        with clock.scope("index"):
            passages, vecs, cached = self.index(Path(options.corpus), options)
        with clock.scope("query"):  # ranked before anything is yielded: the consumer's time is not in it
            results = self.rank(inputs, passages, vecs, options)
        index_s, query_s = clock.total("index"), clock.total("query")
        for i, (inp, res) in enumerate(zip(inputs, results)):
            yield ev.Item(i, inp.source, res)
        yield ev.Done(Metrics(items=len(inputs), passages=len(passages),
                              embedded_passages=0 if cached else len(passages), corpus_cached=cached,
                              index_s=index_s, query_s=query_s,
                              items_per_s=len(inputs) / query_s if query_s > 0 else 0.0))

    def rank(self, inputs, passages: list[Passage], vecs: np.ndarray, options) -> list[Result]:
        """The ``top_k`` passages for each query, best first, by cosine similarity."""
        scores = encode(self.engine, [inp.text for inp in inputs], options.batch_size).vectors @ vecs.T
        results = []
        for i, inp in enumerate(inputs):
            top = np.argsort(-scores[i])[: options.top_k]
            results.append(Result(query=inp.text, hits=[
                Hit(score=float(scores[i, j]), text=passages[j].text, file=passages[j].file,
                    line_start=passages[j].line_start, line_end=passages[j].line_end) for j in top]))
        return results

    def index(self, corpus: Path, options) -> tuple[list[Passage], np.ndarray, bool]:
        files = corpus_files(corpus)
        passages = []
        h = hashlib.sha256(f"{SPLITTER_VERSION}:{options.passage_chars}:{self.card.digest}:{self.dtype}".encode())
        for f in files:
            text = read_text_file(f)
            rel = str(f.relative_to(corpus)) if corpus.is_dir() else f.name
            h.update(rel.encode() + b"\0" + text.encode() + b"\0")
            passages += split_passages(text, rel, options.passage_chars)
        if not passages:
            raise TaskError(f"--corpus {corpus} has no text to search")
        key = h.hexdigest()[:32]
        path = cache_dir() / "corpus" / f"{key}.npz"
        if path.exists():
            try:
                with np.load(path) as z:
                    vecs = z["vectors"]
                if vecs.shape[0] == len(passages):
                    return passages, vecs, True
            except (OSError, ValueError, KeyError):
                pass  # a damaged cache file is rebuilt below
        vecs = encode(self.engine, [p.text for p in passages], options.batch_size).vectors
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{key}.{os.getpid()}.tmp.npz")
        np.savez(tmp, vectors=vecs, meta=np.array(json.dumps({"corpus": str(corpus)})))
        os.replace(tmp, path)
        return passages, vecs, False


def corpus_files(corpus: Path) -> list[Path]:
    if corpus.is_file():
        return [corpus]
    files = [f for f in sorted(corpus.rglob("*"))
             if f.is_file() and not any(p.startswith(".") for p in f.relative_to(corpus).parts)
             and f.suffix.lower() in CORPUS_SUFFIXES and f.stat().st_size and sniff(f) == "text"]
    if not files:
        raise TaskError(f"--corpus {corpus} holds no text or markdown files (.txt, .md, .rst)")
    return files


def split_passages(text: str, file: str, max_chars: int) -> list[Passage]:
    """Paragraphs (blank-line separated), joined while they fit in ``max_chars``; a paragraph
    longer than that is cut at sentence or word boundaries. Line numbers are kept for citing."""
    paras: list[tuple[int, int, str]] = []
    start, buf = None, []
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if line.strip():
            if start is None:
                start = n
            buf.append(line.strip())
        elif buf:
            paras.append((start, n - 1, " ".join(buf)))
            start, buf = None, []
    if buf:
        paras.append((start, len(lines), " ".join(buf)))

    out: list[Passage] = []
    cur: list[tuple[int, int, str]] = []

    def flush():
        if cur:
            out.append(Passage(file, cur[0][0], cur[-1][1], "\n".join(p[2] for p in cur)))
            cur.clear()

    for s, e, p in paras:
        if len(p) > max_chars:
            flush()
            for piece in _cut(p, max_chars):
                out.append(Passage(file, s, e, piece))
            continue
        if cur and sum(len(x[2]) + 1 for x in cur) + len(p) > max_chars:
            # A heading belongs with the text after it, not at the end of the previous passage.
            heading = cur.pop() if len(cur) > 1 and cur[-1][2].startswith("#") else None
            flush()
            if heading:
                cur.append(heading)
        cur.append((s, e, p))
    flush()
    return out


def _cut(text: str, max_chars: int) -> list[str]:
    pieces, rest = [], text
    while len(rest) > max_chars:
        window = rest[:max_chars]
        cut = max(window.rfind(". "), window.rfind("? "), window.rfind("! "))
        if cut < max_chars // 2:
            cut = window.rfind(" ")
        if cut <= 0:
            cut = max_chars - 1
        pieces.append(rest[: cut + 1].strip())
        rest = rest[cut + 1:]
    if rest.strip():
        pieces.append(rest.strip())
    return pieces
