"""`run cache list | size | prune` on a private cache folder filled by taskrun's own code: a
GGUF converted for transformers, the digest index, a search index; prune removes what list shows."""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of its own: pruning must not touch the session cache the other tests share."""
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(folder))
    return folder


def _cache(*args) -> dict:
    r = CliRunner().invoke(main, ["cache", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _fill(cache, tiny_dir, tmp_path):
    """Entries made the way jobs make them."""
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.gguf_convert import ensure_converted
    from taskrun.pipelines.text.index import CorpusIndex
    from tests.tiny import gguf_llama

    ensure_converted(resolve(str(gguf_llama.build(tiny_dir))))  # gguf/<digest> and digests.json
    CorpusIndex(cache / "search-index.sqlite")  # what search opens (pipelines/text/search.py)
    (cache / "notes.txt").write_text("the user's own file, in a folder they pointed the cache at")


def test_list_shows_every_entry_and_prune_removes_what_it_lists(cache, tiny_dir, tmp_path):
    _fill(cache, tiny_dir, tmp_path)
    listed = _cache("list")["entries"]
    kinds = {e["kind"] for e in listed}
    assert {"gguf", "digests", "search", "other"} <= kinds, listed
    gguf = next(e for e in listed if e["kind"] == "gguf")
    assert gguf["bytes"] > 10_000 and "tiny-llama.gguf" in gguf["what"]  # the source model is named
    size = _cache("size")
    assert size["bytes"] == sum(e["bytes"] for e in listed) and size["entries"] == len(listed)

    dry = _cache("prune", "--all", "--dry-run")
    assert sorted(dry["removed"]) == sorted(e["name"] for e in listed if e["kind"] != "other")
    assert _cache("list")["entries"] == listed  # a dry run removes nothing

    gone = _cache("prune", gguf["name"])
    assert gone["removed"] == [gguf["name"]] and gone["freed_bytes"] == gguf["bytes"]
    assert not (cache / gguf["name"]).exists()
    left = _cache("prune", "--all")
    assert sorted(left["removed"]) == sorted(e["name"] for e in listed if e["kind"] not in ("gguf", "other"))
    assert [e["name"] for e in _cache("list")["entries"]] == ["notes.txt"]  # only what taskrun did not write
    assert _cache("prune", "notes.txt")["removed"] == ["notes.txt"]  # ...which goes when named
    assert os.listdir(cache) == []


def test_older_than_keeps_recent_entries(cache, tmp_path):
    from taskrun.models.cache_record import note_written

    (cache / "gguf" / "old").mkdir(parents=True)
    (cache / "gguf" / "old" / "model.safetensors").write_bytes(b"x" * 100)
    (cache / "digests.json").write_text("{}")
    for p in (cache / "gguf" / "old", cache / "digests.json"):
        note_written(p, cache)  # as taskrun records what it writes
    week_ago = time.time() - 8 * 86400
    for p in (cache / "gguf" / "old" / "model.safetensors", cache / "gguf" / "old"):
        os.utime(p, (week_ago, week_ago))
    assert _cache("prune", "--older-than", "7")["removed"] == ["gguf/old"]
    assert [e["name"] for e in _cache("list")["entries"]] == ["digests.json"]


def test_prune_needs_a_choice_and_known_names(cache):
    r = CliRunner().invoke(main, ["cache", "prune"])
    assert r.exit_code == 2 and "--all" in r.output
    r = CliRunner().invoke(main, ["cache", "prune", "gguf/nothing"])
    assert r.exit_code == 2 and "no cache entry gguf/nothing" in r.output


def test_prune_all_keeps_the_users_own_files_in_a_shared_cache_folder(cache, tiny_dir, tmp_path):
    """Issue 33 item 9: kinds were matched by name, so the user's own models in gguf/ and joined/
    of a shared TASKRUN_CACHE_DIR went with --all. Only what taskrun recorded writing goes now."""
    _fill(cache, tiny_dir, tmp_path)
    (cache / "joined").mkdir()
    mine = [cache / "gguf" / "my-llama-7b.Q4_K_M.gguf", cache / "joined" / "my-merged-model.bin"]
    for p in mine:
        p.write_bytes(b"GGUF" + b"\0" * 1000)
    listed = {e["name"]: e for e in _cache("list")["entries"]}
    assert listed["gguf/my-llama-7b.Q4_K_M.gguf"]["kind"] == "other", listed
    removed = _cache("prune", "--all")["removed"]
    assert (
        "digests.json" in removed and "search-index.sqlite" in removed and any(n.startswith("gguf/") for n in removed)
    )
    assert all(p.read_bytes().startswith(b"GGUF") for p in mine)  # the user's files are all there
    assert (cache / "notes.txt").exists()
    left = {e["name"] for e in _cache("list")["entries"]}
    assert left == {"gguf/my-llama-7b.Q4_K_M.gguf", "joined/my-merged-model.bin", "notes.txt"}, left


def test_text_output_names_sizes_and_the_folder(cache):
    from taskrun.models.cache_record import note_written

    (cache / "digests.json").write_text("{}")
    note_written(cache / "digests.json", cache)
    r = CliRunner().invoke(main, ["cache", "list"])
    assert r.exit_code == 0 and "digests.json" in r.stdout and "sha256 digests" in r.stdout
    assert str(cache) in r.stderr
    r = CliRunner().invoke(main, ["cache", "size"])
    assert r.exit_code == 0 and str(cache) in r.stdout and "digests" in r.stdout


def test_every_cache_the_code_writes_is_a_known_kind():
    """A new ``cache_dir() / "name"`` in the code must get its row in cache_cmd.KINDS, or `run cache
    list` would call it "other" and --all would leave it."""
    import re
    from fnmatch import fnmatch
    from pathlib import Path

    from taskrun.pipelines.text.search import INDEX_FILE
    from taskrun.runner.commands.cache import KINDS

    root = Path(__file__).resolve().parent.parent
    named = {INDEX_FILE, "digests.json"}
    for layer in ("runner", "pipelines", "models", "tasks"):
        for f in (root / layer).rglob("*.py"):
            named |= set(re.findall(r'\b(?:cache_dir\(\)|cache)\s*/\s*"([^"]+)"', f.read_text()))
    assert {"gguf", "llamacpp", "joined"} <= named  # the scan sees the known writers
    for name in named:
        assert any(fnmatch(name + "/x", pat) or fnmatch(name, pat) for pat, _, _ in KINDS), name


def test_a_join_from_before_the_record_is_recognised_by_its_sha256_and_the_rest_is_left(cache, monkeypatch):
    """Issue 33 item 9: joined models written before taskrun recorded what it writes were kept by
    --all for ever. One whose bytes hash to the sha256 models.toml pins for its alias is taskrun's
    (recorded, then pruned); a look-alike (other bytes, a file of the user's inside) or a file of
    the user's is left, and prune says so."""
    import hashlib

    from taskrun.models import join_known
    from taskrun.models.cache_record import written

    data = b"GGUF" + bytes(range(256)) * 64
    pinned = "sha256:" + hashlib.sha256(data).hexdigest()
    table = {
        "tiny-joined": ("tiny.gguf", pinned, frozenset({"config.json"})),
        "edited-joined": ("tiny.gguf", pinned, frozenset()),
        "crowded-joined": ("tiny.gguf", pinned, frozenset()),
    }
    monkeypatch.setattr(join_known, "known_joins", lambda: table)  # the digests models.toml pins
    joined = cache / "joined"
    for alias, files in (
        ("tiny-joined", {"tiny.gguf": data, "config.json": b"{}"}),  # as the join wrote it, unrecorded
        ("edited-joined", {"tiny.gguf": data[:-1] + b"!"}),  # one byte differs from the pinned file
        ("crowded-joined", {"tiny.gguf": data, "my-notes.txt": b"mine"}),  # the user's file inside
    ):
        (joined / alias).mkdir(parents=True)
        for name, content in files.items():
            (joined / alias / name).write_bytes(content)
    (joined / "my-merged-model.bin").write_bytes(data)  # the user's own, even with the same bytes
    (joined / ".whisper-base.lock").write_bytes(b"")  # the empty lock a join of models.toml's takes
    (joined / ".my-model.lock").write_bytes(b"")  # not a join taskrun knows
    assert not (cache / ".taskrun-written").exists()  # nothing recorded: all from before the record

    kinds = {e["name"]: e["kind"] for e in _cache("list")["entries"]}
    assert kinds["joined/tiny-joined"] == kinds["joined/.whisper-base.lock"] == "joined", kinds
    assert {kinds[n] for n in ("joined/edited-joined", "joined/crowded-joined", "joined/my-merged-model.bin")} == {
        "other"
    }
    assert kinds["joined/.my-model.lock"] == "other"
    assert "joined/tiny-joined" in written(cache)  # adopted into the record

    r = CliRunner().invoke(main, ["cache", "prune", "--all"])
    assert r.exit_code == 0, r.output
    assert "removed joined/tiny-joined" in r.stdout
    for name in (
        "joined/edited-joined",
        "joined/crowded-joined",
        "joined/my-merged-model.bin",
        "joined/.my-model.lock",
    ):
        assert f"left {name}" in r.stderr and (cache / name).exists(), r.stderr
    assert not (joined / "tiny-joined").exists() and not (joined / ".whisper-base.lock").exists()
    assert (joined / "crowded-joined" / "tiny.gguf").read_bytes() == data  # nothing inside touched
    left = _cache("prune", "--all")
    assert left["removed"] == [] and set(left["left"]) == {
        "joined/edited-joined",
        "joined/crowded-joined",
        "joined/my-merged-model.bin",
        "joined/.my-model.lock",
    }


def test_every_pinned_join_in_models_toml_is_known():
    """The table recognised() reads is models.toml's: each `join` entry with a `sha256`."""
    from taskrun.models.join_known import known_joins
    from taskrun.models.resolve import aliases

    pinned = {name for name, e in aliases().items() if e.get("join") and e.get("sha256")}
    assert pinned and set(known_joins()) == pinned
    name, digest, beside = known_joins()["qwen2.5-coder-1.5b"]
    assert name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" and beside == frozenset()
    assert digest == "sha256:cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
