"""search on any text-encoder engine: split a corpus into passages, embed them, rank by cosine.

The corpus's vectors live in an incremental index (pipelines/text/index.py), one entry per file:
a search embeds only the files that are new or changed since the last one (and the queries),
reuses the rest, and forgets files that are gone. `run ask` searches the same index.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taskrun.models.resolve import cache_dir
from taskrun.pipelines.text.encoder import EncoderPipeline, Encoding, encode
from taskrun.pipelines.text.index import CorpusIndex, Entry
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.clock import timed
from taskrun.tasks.inputs import read_text_file, sniff
from taskrun.tasks.search import Hit, Metrics, Result

CORPUS_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".text", ""}
SPLITTER_VERSION = 1  # bump when split_passages changes, so old index entries are not reused
INDEX_FILE = "search-index.sqlite"


@dataclass
class Passage:
    file: str
    line_start: int
    line_end: int
    text: str


@dataclass
class Indexed:
    """The corpus as the index gave it: its passages, their vectors, and what this search did."""

    passages: list[Passage]
    vectors: np.ndarray
    files: int = 0
    embedded: int = 0  # passages embedded in this search
    files_embedded: int = 0
    files_dropped: int = 0


class SearchPipeline(EncoderPipeline):
    task = "search"

    def run(self, inputs, options, clock):
        # The index's own time: not the consumer's at each progress event.
        ix = yield from timed(self.index(Path(options.corpus), options), lambda s: clock.add("index", s))
        with clock.scope("query"):  # ranked before anything is yielded: the consumer's time is not in it
            results = self.rank(inputs, ix.passages, ix.vectors, options)
        index_s, query_s = clock.total("index"), clock.total("query")
        for i, (inp, res) in enumerate(zip(inputs, results)):
            yield ev.Item(i, inp.source, res)
        n = len(ix.passages)
        yield ev.Done(
            Metrics(
                items=len(inputs),
                passages=n,
                embedded_passages=ix.embedded,
                reused_passages=n - ix.embedded,
                corpus_cached=ix.embedded == 0,
                files=ix.files,
                files_embedded=ix.files_embedded,
                files_dropped=ix.files_dropped,
                index_s=index_s,
                query_s=query_s,
                items_per_s=len(inputs) / query_s if query_s > 0 else 0.0,
            )
        )

    def rank(self, inputs, passages: list[Passage], vecs: np.ndarray, options) -> list[Result]:
        """The ``top_k`` passages for each query, best first, by cosine similarity."""
        scores = encode(self.engine, [inp.text for inp in inputs], options.batch_size).vectors @ vecs.T
        results = []
        for i, inp in enumerate(inputs):
            top = np.argsort(-scores[i])[: options.top_k]
            results.append(
                Result(
                    query=inp.text,
                    hits=[
                        Hit(
                            score=float(scores[i, j]),
                            text=passages[j].text,
                            file=passages[j].file,
                            line_start=passages[j].line_start,
                            line_end=passages[j].line_end,
                        )
                        for j in top
                    ],
                )
            )
        return results

    def space(self, options) -> str:
        """What a file's vectors depend on besides its text."""
        return f"{self.card.digest}|{self.runtime}|{self.dtype}|split{SPLITTER_VERSION}|{options.passage_chars}"

    def index(self, corpus: Path, options):
        """Bring the index up to date for ``corpus`` (yielding progress while embedding) and
        return the corpus's passages and vectors in file order."""
        files, skipped = corpus_files(corpus)
        store = CorpusIndex(cache_dir() / INDEX_FILE)
        space, texts = self.space(options), {}
        for f in files:
            try:
                texts[str(f.resolve())] = (f, read_text_file(f))
            except (OSError, TaskError) as exc:
                skipped.append((f, getattr(exc, "strerror", None) or str(exc)))
        if skipped:
            yield ev.Notice(_skipped_note(corpus, skipped))
        if not texts:
            raise TaskError(f"--corpus {corpus} has no text file that could be read")
        held = store.entries(space, list(texts))
        entries, todo = {}, {}
        for key, (_, text) in texts.items():
            digest = hashlib.sha256(text.encode()).hexdigest()
            old = held.get(key)
            if old is not None and old.digest == digest:
                entries[key] = old
            else:
                cut = split_passages(text, "", options.passage_chars)
                todo[key] = Entry(
                    digest,
                    [(p.line_start, p.line_end, p.text) for p in cut],
                    np.zeros((0, self.engine.dim), np.float32),
                )
        if store.damaged:
            yield ev.Notice(
                f"the search index {store.path} could not be read ({store.damaged}); it is "
                f"taskrun's own cache, so it was rebuilt and those files are embedded again"
            )
        yield from self._embed(todo, options)
        dropped = store.update(space, todo, set(texts), str(corpus.resolve()) if corpus.is_dir() else None)
        if store.unsaved:
            yield ev.Notice(
                f"the search index {store.path} could not be written ({store.unsaved}); the "
                f"results are right, but the next search embeds the corpus again"
            )
        entries.update(todo)
        return self._assemble(corpus, texts, entries, todo, dropped)

    def _embed(self, todo: dict[str, Entry], options):
        """Embed the passages of new and changed files, reporting progress in passages."""
        flat = [p[2] for e in todo.values() for p in e.passages]
        if not flat:
            return
        enc = Encoding(self.engine, flat, options.batch_size)
        for done in enc.steps():
            yield ev.Progress(done, len(flat), "passages", "indexing")
        at = 0
        for e in todo.values():
            e.vectors = enc.vectors[at : at + len(e.passages)]
            at += len(e.passages)

    def _assemble(self, corpus: Path, texts: dict, entries: dict[str, Entry], todo: dict, dropped: int) -> Indexed:
        passages, vectors = [], []
        for key, (f, _) in texts.items():
            rel = str(f.relative_to(corpus)) if corpus.is_dir() else f.name
            passages += [Passage(rel, a, b, t) for a, b, t in entries[key].passages]
            vectors.append(entries[key].vectors)
        if not passages:
            raise TaskError(f"--corpus {corpus} has no text to search")
        return Indexed(
            passages,
            np.concatenate(vectors).astype(np.float32, copy=False),
            files=len(texts),
            embedded=sum(len(e.passages) for e in todo.values()),
            files_embedded=len(todo),
            files_dropped=dropped,
        )


def corpus_files(corpus: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The text files of a corpus (a file, or a folder walked without following links; hidden
    files, empty files and anything but regular files left out), and those that could not be
    read, each with why."""
    if corpus.is_file():
        return [corpus], []
    files, skipped = [], []

    def unreadable(exc: OSError) -> None:
        skipped.append((Path(exc.filename or corpus), exc.strerror or str(exc)))

    for top, dirs, names in os.walk(corpus, onerror=unreadable):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            f = Path(top) / name
            if name.startswith(".") or f.suffix.lower() not in CORPUS_SUFFIXES:
                continue
            try:
                st = f.lstat()
                if stat.S_ISREG(st.st_mode) and st.st_size and sniff(f) == "text":
                    files.append(f)
            except OSError as exc:
                skipped.append((f, exc.strerror or str(exc)))
    if not files:
        more = f" ({len(skipped)} could not be read, e.g. {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise TaskError(f"--corpus {corpus} holds no text or markdown files (.txt, .md, .rst){more}")
    return sorted(files), skipped


def _skipped_note(corpus: Path, skipped: list[tuple[Path, str]]) -> str:
    shown = "; ".join(f"{f}: {why}" for f, why in skipped[:3])
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return f"{len(skipped)} file(s) in --corpus {corpus} could not be read and are not searched ({shown}{more})"


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
        rest = rest[cut + 1 :]
    if rest.strip():
        pieces.append(rest.strip())
    return pieces
