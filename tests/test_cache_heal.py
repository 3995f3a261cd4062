"""Self-healing caches (issue 14, class 2): the search index, the GGUF and CTranslate2 conversions
and digests.json are taskrun's own files; a damaged one is removed and rebuilt with one warning
line naming it, the answer is the same as from a fresh cache, interrupted conversions' temporary
folders are cleaned, a forged or stale digest is not trusted, and the run log names the digest of
the converted copy that actually ran."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.models import cache_entry
from taskrun.runner.cli import main
from tests.tiny.bert import build as tiny_bert

TOPICS = [
    "cats sleep most of the day",
    "espresso is brewed under pressure",
    "mars has two small moons",
    "meetings need an agenda",
    "the violin has four strings",
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder: these tests damage it."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(d))
    from taskrun.pipelines import clear_cache

    clear_cache()  # a model loaded in-process would skip the checks that run at load
    yield d
    clear_cache()


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# --------------------------------------------------------------------------- the search index


@pytest.fixture(scope="module")
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    for i, topic in enumerate(TOPICS):
        (d / f"{i}.md").write_text("\n\n".join(f"# Part {k}\n{topic}, note {k}." for k in range(6)) + "\n")
    return d


def search(bert, corpus):
    r = run("search", "tell me about moons", "--corpus", corpus, "--model", bert, "--passage-chars", "60", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    hits = [(h["file"], h["line_start"], round(h["score"], 4)) for h in out["items"][0]["result"]["hits"]]
    return out, hits, r.stderr


def _settle(index: Path) -> None:
    """Fold the WAL into the main file, so damage to the file is damage to the index."""
    with sqlite3.connect(index) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for side in ("-wal", "-shm"):
        Path(f"{index}{side}").unlink(missing_ok=True)


def _garbage(p: Path) -> None:
    p.write_bytes(b"this is not a database" * 200)


def _truncated(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _torn_page(p: Path) -> None:
    data = bytearray(p.read_bytes())
    for off in range(4096, len(data), 4096):  # every page but the header's: its b-tree header too
        data[off : off + 64] = os.urandom(64)
    p.write_bytes(bytes(data))


def _flipped_vectors(p: Path) -> None:
    with sqlite3.connect(p) as db:
        db.execute("UPDATE files SET vectors = randomblob(length(vectors)) WHERE path LIKE '%2.md'")
    _settle(p)


DAMAGE = {
    "not a database": _garbage,
    "truncated": _truncated,
    "torn pages": _torn_page,
    "one row's vectors changed": _flipped_vectors,
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_search_index_is_rebuilt_with_one_warning_and_the_same_answer(kind, cache, bert, corpus):
    _, fresh, _ = search(bert, corpus)
    index = cache / "search-index.sqlite"
    _settle(index)
    DAMAGE[kind](index)
    out, hits, err = search(bert, corpus)
    assert hits == fresh
    assert err.count("note: the search index") == 1 and "taskrun's own cache" in err and str(index) in err
    assert out["metrics"]["embedded_passages"] >= 6  # the damaged part was embedded again
    again, hits, err = search(bert, corpus)
    assert hits == fresh and again["notes"] == [] and again["metrics"]["corpus_cached"]


def test_an_empty_index_file_is_a_new_index(cache, bert, corpus):
    _, fresh, _ = search(bert, corpus)
    index = cache / "search-index.sqlite"
    _settle(index)
    index.write_bytes(b"")
    out, hits, _ = search(bert, corpus)
    assert hits == fresh and out["metrics"]["files_embedded"] == len(TOPICS)


def test_a_cache_that_cannot_be_written_still_searches_and_says_so(monkeypatch, bert, corpus):
    monkeypatch.setenv("TASKRUN_CACHE_DIR", "/proc/self/taskrun-cache")  # no one can create it
    out, hits, err = search(bert, corpus)
    assert hits and "could not be written" in err and "the results are right" in err
    assert "taskrun's cache" in err and "TASKRUN_CACHE_DIR" in err  # said before the model loads


# --------------------------------------------------------------------------- GGUF → safetensors


@pytest.fixture(scope="module")
def gguf(tiny_dir):
    from tests.tiny.gguf_llama import build

    return build(tiny_dir)


def generate(model):
    r = run(
        "generate",
        "What is the capital of France?",
        "--model",
        model,
        "--runtime",
        "transformers",
        "--max-tokens",
        "12",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert "de-quantizing" not in r.stderr and "it/s" not in r.stderr  # no third-party progress bar
    return json.loads(r.stdout), r.stderr


def _converted(cache: Path) -> Path:
    (folder,) = [d for d in (cache / "gguf").iterdir() if not d.name.startswith(".")]
    return folder


def _random_bytes_inside(f: Path) -> Path:
    """The same size and mtime, other bytes in the middle (the issue's 'runs and answers nothing')."""
    f = f / "model.safetensors"
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(st.st_size // 2)
        fh.write(os.urandom(4096))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    return f


def _truncate_weights(f: Path) -> Path:
    f = f / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    return f


def _edit_config(f: Path) -> Path:
    f = f / "config.json"
    f.write_text(f.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1'))
    return f


def _no_manifest(f: Path) -> Path:
    (f / "manifest.json").unlink()
    return f


def _no_tokenizer(f: Path) -> Path:
    (f / "tokenizer.json").unlink()
    return f / "tokenizer.json"


CONVERTED_DAMAGE = {
    "random bytes inside the weights": _random_bytes_inside,
    "weights cut short": _truncate_weights,
    "config edited": _edit_config,
    "manifest removed": _no_manifest,
    "tokenizer removed": _no_tokenizer,
}


@pytest.mark.parametrize("kind", list(CONVERTED_DAMAGE))
def test_a_damaged_gguf_conversion_is_rebuilt_with_one_warning_and_the_same_text(kind, cache, gguf, tiny_dir):
    from taskrun.pipelines import clear_cache
    from tests.tiny.generate import build as build_hf

    first, _ = generate(gguf)
    clear_cache()
    hf, _ = generate(build_hf(tiny_dir))  # float32 HF folder: the float16 copy gives the same greedy text
    assert first["items"][0]["result"]["text"] == hf["items"][0]["result"]["text"]
    clear_cache()
    damaged = CONVERTED_DAMAGE[kind](_converted(cache))
    out, err = generate(gguf)
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "taskrun's own cache" in warnings[0]
    assert str(damaged) in warnings[0] or str(damaged.parent) in warnings[0]
    assert out["items"][0]["result"]["text"] == first["items"][0]["result"]["text"]
    assert cache_entry.problem(_converted(cache), out["model"]["digest"]) is None


def test_the_conversion_is_float16_and_the_log_names_what_ran(cache, gguf):
    from safetensors import safe_open

    from taskrun.runner.runlog.store import RunLog

    out, _ = generate(gguf)
    folder = _converted(cache)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.float16"}
    row = RunLog().recent(1)[0]
    assert row["model_digest"] == out["model"]["digest"] and out["model"]["path"].endswith(".gguf")
    ran = json.loads(row["notes"]) if isinstance(row["notes"], str) else row["notes"]
    assert any(cache_entry.digest_of(folder) in n and str(folder) in n for n in ran)


def test_stale_temporary_folders_are_cleaned_when_a_conversion_starts(cache, gguf):
    parent = cache / "gguf"
    parent.mkdir(parents=True)
    dead = parent / ".abc.tmp-999999999-x1"  # no such process
    legacy = parent / ".abc.k2j3h4"  # an older taskrun's name, without a pid
    live = parent / f".abc.tmp-{os.getpid()}-x2"
    for d in (dead, legacy, live):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 1000)
    hour_ago = time.time() - 2 * 3600
    os.utime(legacy, (hour_ago, hour_ago))
    generate(gguf)
    assert not dead.exists() and not legacy.exists() and live.exists()


# --------------------------------------------------------------------------- cache entries


@pytest.fixture
def entry(tmp_path):
    d = tmp_path / "entry"
    d.mkdir()
    (d / "config.json").write_text('{"a": 1}')
    (d / "big.bin").write_bytes(os.urandom(3 << 20))  # above SMALL: sampled on every use
    cache_entry.write_manifest(d, "sha256:src")
    return d


def test_a_sound_entry_costs_no_full_digest_of_its_big_files(entry, monkeypatch):
    calls = []
    real = cache_entry._sha256
    monkeypatch.setattr(cache_entry, "_sha256", lambda p: calls.append(p.name) or real(p))
    assert cache_entry.problem(entry, "sha256:src") is None
    assert "big.bin" not in calls


@pytest.mark.parametrize("where", ["between the sampled blocks", "in the first block", "in the last block"])
def test_a_byte_changed_anywhere_with_the_mtime_put_back_is_found(entry, where):
    f = entry / "big.bin"
    time.sleep(0.05)  # a ctime tick later than the manifest's (file times are kept in ~4 ms ticks)
    st = f.stat()
    off = {
        "between the sampled blocks": (3 << 20) // 14 + 100,
        "in the first block": 10,
        "in the last block": st.st_size - 10,
    }[where]
    with open(f, "r+b") as fh:
        fh.seek(off)
        old = fh.read(1)
        fh.seek(off)
        fh.write(bytes([old[0] ^ 0xFF]))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "big.bin does not match its digest" in cache_entry.problem(entry, "sha256:src")


def test_an_entry_of_another_source_is_not_used(entry):
    assert "another source" in cache_entry.problem(entry, "sha256:other")


# --------------------------------------------------------------------------- CTranslate2 → transformers


def test_a_damaged_ct2_conversion_is_rebuilt_with_one_warning(tmp_path, tiny_dir, capsys):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.speech.ct2_convert import converted_folder
    from tests.tiny.whisper import build_ct2

    card = resolve(str(build_ct2(tiny_dir)))
    root = tmp_path / "cache"
    folder = converted_folder(card, root)
    weights = next(folder.glob("*.safetensors"))
    want = hashlib.sha256(weights.read_bytes()).hexdigest()
    capsys.readouterr()
    _random_bytes_inside(folder) if weights.name == "model.safetensors" else weights.write_bytes(b"x")
    (root / "converted" / ".whisper-old.tmp-999999999-zz").mkdir()  # left by a killed conversion
    again = converted_folder(card, root)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "taskrun's own cache" in err and weights.name in err
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == want and again == folder
    assert not (root / "converted" / ".whisper-old.tmp-999999999-zz").exists()
    assert "ran the converted copy" in card.extra["ran"][0]


# --------------------------------------------------------------------------- digests.json


@pytest.fixture
def model_file(tmp_path):
    f = tmp_path / "m" / "weights.bin"
    f.parent.mkdir()
    f.write_bytes(os.urandom(300_000))
    return f


def _true_digest(f: Path) -> str:
    return "sha256:" + hashlib.sha256(f.read_bytes()).hexdigest()


def _old_stamp(f: Path) -> str:
    """The stamp of the old cache format: name, size and mtime only."""
    st = f.stat()
    return hashlib.sha256(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def test_a_forged_size_and_mtime_entry_is_not_trusted(tmp_path, model_file):
    from taskrun.models.digest import digest_path

    cache = tmp_path / "c"
    cache.mkdir()
    forged = "sha256:" + "0" * 64
    (cache / "digests.json").write_text(
        json.dumps({str(model_file.resolve()): {"stamp": _old_stamp(model_file), "digest": forged}})
    )
    assert digest_path(model_file, cache) == _true_digest(model_file)


def test_a_file_changed_with_its_size_and_mtime_put_back_is_hashed_again(tmp_path, model_file):
    from taskrun.models.digest import digest_path

    cache = tmp_path / "c"
    cache.mkdir()
    assert digest_path(model_file, cache) == _true_digest(model_file)
    time.sleep(0.05)  # a ctime tick later (file times are kept in ~4 ms ticks)
    st = model_file.stat()
    data = bytearray(model_file.read_bytes())
    data[150_000] ^= 0xFF  # in the middle: not in the first or last 64 KiB
    model_file.write_bytes(bytes(data))
    os.utime(model_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert digest_path(model_file, cache) == _true_digest(model_file)


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"x": 5}', ""])
def test_a_damaged_digests_file_is_only_a_cache(tmp_path, model_file, content):
    from taskrun.models.digest import digest_path

    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "digests.json").write_text(content)
    assert digest_path(model_file, cache) == _true_digest(model_file)
    assert json.loads((cache / "digests.json").read_text())[str(model_file.resolve())]["digest"] == _true_digest(
        model_file
    )


def test_a_cache_that_cannot_be_written_still_gives_the_digest(model_file):
    from taskrun.models.digest import digest_path

    assert digest_path(model_file, Path("/proc/self")) == _true_digest(model_file)
