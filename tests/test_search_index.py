"""The incremental search index: one entry per corpus file (path + text digest, within the model's
space) in SQLite under the cache folder. Unchanged files are reused, changed ones embedded again,
deleted ones dropped, a damaged index rebuilt with one notice; chains (and so `run ask`) search the
same index. Fast: the tiny random BERT stands in for MiniLM."""

from __future__ import annotations

import json
import os
import sqlite3
import stat

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.tiny.bert import build as tiny_bert

TOPICS = [
    "cats sleep most of the day",
    "espresso is brewed under pressure",
    "mars has two small moons",
    "meetings need an agenda",
    "whisper transcribes speech",
    "the violin has four strings",
]


@pytest.fixture(scope="module")
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    for i, topic in enumerate(TOPICS):
        f = d / ("sub" if i % 2 else "") / f"{i}.md"
        f.write_text("\n\n".join(f"# Part {k}\n{topic}, note {k}." for k in range(4)) + "\n")
    return d


def search(bert, corpus, *extra, query="tell me about moons"):
    r = CliRunner().invoke(
        main,
        ["search", query, "--corpus", str(corpus), "--model", bert, "--passage-chars", "60", "--json", "-q", *extra],
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_unchanged_files_are_reused_changed_embedded_deleted_dropped(bert, corpus):
    first = search(bert, corpus)["metrics"]
    n = first["passages"]
    assert first["files"] == 6 and first["files_embedded"] == 6
    assert first["embedded_passages"] == n and first["reused_passages"] == 0 and not first["corpus_cached"]

    again = search(bert, corpus)["metrics"]
    assert again["embedded_passages"] == 0 and again["reused_passages"] == n and again["corpus_cached"]

    old0 = cut(corpus / "0.md")
    (corpus / "0.md").write_text(
        "# Changed\nsomething else entirely, with more words.\n\n# More\n"
        "and a second part, long enough to be its own passage.\n"
    )
    edited = search(bert, corpus)["metrics"]
    new0 = cut(corpus / "0.md")
    assert new0 >= 2 and edited["files_embedded"] == 1 and edited["embedded_passages"] == new0
    assert edited["passages"] == n - old0 + new0 and edited["reused_passages"] == n - old0

    gone = cut(corpus / "sub" / "3.md")
    (corpus / "sub" / "3.md").unlink()
    (corpus / "new.txt").write_text("a brand new file about moons.\n")
    moved = search(bert, corpus)["metrics"]
    assert moved["files"] == 6 and moved["files_dropped"] == 1 and moved["files_embedded"] == 1
    assert moved["embedded_passages"] == 1 and moved["passages"] == edited["passages"] - gone + 1


def cut(path) -> int:
    """How many passages the searches above cut ``path`` into."""
    from taskrun.pipelines.text.search import split_passages

    return len(split_passages(path.read_text(), "", 60))


def test_hits_from_the_index_equal_a_fresh_index(bert, corpus, tmp_path, monkeypatch):
    search(bert, corpus)
    (corpus / "2.md").write_text("# Moons\nphobos and deimos orbit mars.\n")
    kept = search(bert, corpus, "-k", "4")
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(tmp_path / "fresh-cache"))
    fresh = search(bert, corpus, "-k", "4")
    assert fresh["metrics"]["reused_passages"] == 0

    def hits(out):
        return [(h["file"], h["line_start"], round(h["score"], 5)) for h in out["items"][0]["result"]["hits"]]

    assert hits(kept) == hits(fresh)


def test_the_index_is_one_private_sqlite_file_keyed_per_file(bert, corpus, session_cache):
    old = os.umask(0o022)
    try:
        search(bert, corpus)
    finally:
        os.umask(old)
    path = session_cache / "search-index.sqlite"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = db.execute("SELECT path, digest FROM files WHERE path LIKE ?", (f"{corpus.resolve()}%",)).fetchall()
    assert sorted(os.path.basename(p) for p, _ in rows) == [f"{i}.md" for i in range(6)]


def test_a_damaged_index_is_rebuilt_with_one_notice(bert, corpus, session_cache):
    search(bert, corpus)
    path = session_cache / "search-index.sqlite"
    for side in ("-wal", "-shm"):
        (session_cache / f"search-index.sqlite{side}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    r = CliRunner().invoke(
        main, ["search", "moons", "--corpus", str(corpus), "--model", bert, "--passage-chars", "60", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert r.stderr.count("could not be read") == 1 and "rebuilt" in r.stderr
    out = json.loads(r.stdout)
    assert out["metrics"]["reused_passages"] == 0 and len(out["notes"]) == 1
    # kept in the run log too (which also names a converted copy the model ran, such as an ONNX export)
    assert RunLog().recent(1)[0]["notes"][: len(out["notes"])] == out["notes"]
    assert search(bert, corpus)["notes"] == []


def test_progress_is_reported_in_passages(bert, corpus):
    from taskrun.runner.jobs import run_job
    from taskrun.tasks import REGISTRY
    from taskrun.tasks.base import Input, make_options

    task = REGISTRY["search"]
    seen = []
    opts = make_options(task.Options, {"corpus": str(corpus), "passage_chars": 60, "batch_size": 4})
    run_job(task, lambda: [Input("q", "text", "moons")], opts, model=bert, on_event=seen.append)
    bars = [e for e in seen if type(e).__name__ == "Progress"]
    assert bars and all(b.unit == "passages" and b.total == bars[-1].done for b in bars)
    assert [b.done for b in bars] == sorted(b.done for b in bars) and len(bars) > 2


def test_a_chain_searches_the_same_index(bert, corpus, tmp_path):
    """`run ask` is the ask-docs chain, whose first step is a search: a chain step and `run search`
    with the same settings share index entries."""
    chain = tmp_path / "retrieve.toml"
    chain.write_text(
        f'name = "retrieve"\ninputs = {{ question = "text", docs = "path" }}\n\n[[steps]]\n'
        f'task = "search"\ninput = "question"\nmodel = "{bert}"\n'
        f'options = {{ corpus = "{{docs}}", top_k = 2, passage_chars = 60 }}\n'
    )
    r = CliRunner().invoke(
        main, ["chain", str(chain), "moons", str(corpus), "--json", "-q", "-o", str(tmp_path / "out")]
    )
    assert r.exit_code == 0, r.output
    assert search(bert, corpus)["metrics"]["corpus_cached"] is True


def test_at_most_four_passage_sizes_are_kept_per_corpus_least_recently_used_first(bert, corpus, session_cache):
    """Issue 33 item 17: each passage size is a whole copy of the corpus's vectors."""
    path = session_cache / "search-index.sqlite"

    def spaces() -> set[str]:
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT DISTINCT space FROM files WHERE path LIKE ?", (f"{corpus.resolve()}%",))
            return {s.rsplit("|", 1)[1] for (s,) in rows}

    for chars in (60, 70, 80, 90):
        search(bert, corpus, "--passage-chars", str(chars))
    assert spaces() == {"60", "70", "80", "90"}
    search(bert, corpus, "--passage-chars", "60")  # used again: now the most recent
    for chars in (100, 110):
        search(bert, corpus, "--passage-chars", str(chars))
    assert spaces() == {"60", "90", "100", "110"}
    assert search(bert, corpus, "--passage-chars", "60")["metrics"]["corpus_cached"] is True
