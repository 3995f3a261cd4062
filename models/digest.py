"""sha256 digests of model files, computed once and cached in ``<cache>/digests.json``.

A friendly name can move to a different artifact; the digest recorded with every run says which
bytes actually ran. Hashing a few hundred MB takes seconds, so it is done once per version of the
files, not per run.

An entry is reused only while every file keeps its size, mtime, inode and ctime, and the same first
and last 64 KiB (a "stamp", checked on every use for ~1 ms a model). Size and mtime alone are easy to
keep while changing a file (``touch -r`` restores an mtime), and an entry copied from another file
or machine would match them; the ctime cannot be set back by a user (any write or ``utime`` moves it
to now) and the inode differs for a copy, so such an entry is recomputed, not trusted. This guards
the cache against stale and copied entries, not against someone who can write both the model and the
cache folder as the same user (they could write the run log too).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# Files that describe a model but do not change what it computes.
_SKIP = {"README.md", ".gitattributes", "LICENSE", "LICENSE.txt"}


def model_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(
        f
        for f in path.rglob("*")
        if f.is_file() and f.name not in _SKIP and "__pycache__" not in f.parts and not f.name.endswith((".py", ".pyc"))
    )


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in model_files(path))


EDGE = 1 << 16  # the bytes read at each end of every file for its stamp


def _stamp(path: Path, files: list[Path]) -> str:
    h = hashlib.sha256(b"stamp2\0")  # a new stamp format: entries of the old (size, mtime) one never match
    for f in files:
        st = f.stat()
        rel = f.relative_to(path) if path.is_dir() else f.name
        h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(EDGE))
            if st.st_size > 2 * EDGE:
                fh.seek(-EDGE, os.SEEK_END)
                h.update(fh.read(EDGE))
    return h.hexdigest()


def hash_files(path: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def digest_path(path: Path, cache: Path) -> str:
    """The digest of a model file or folder, from the cache when the files have not changed."""
    path = Path(path).resolve()
    files = model_files(path)
    stamp = _stamp(path, files)
    index = cache / "digests.json"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):  # missing, unreadable or damaged: it is only a cache
        known = {}
    hit = known.get(str(path)) if isinstance(known, dict) else None
    if isinstance(hit, dict) and hit.get("stamp") == stamp and isinstance(hit.get("digest"), str):
        return hit["digest"]
    digest = hash_files(path, files)
    if not isinstance(known, dict):
        known = {}
    known[str(path)] = {"stamp": stamp, "digest": digest}
    tmp = index.with_name(f"digests.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, index)  # atomic: a concurrent writer loses at most a cache entry, never the file
        from taskrun.models.cache_record import note_written

        note_written(index, cache)
    except OSError:  # a read-only or full cache: the digest is right, it is only not remembered
        tmp.unlink(missing_ok=True)
    return digest
