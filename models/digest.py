"""sha256 digests of model files, computed once and cached by (path, size, mtime).

A friendly name can move to a different artifact; the digest recorded with every run says which
bytes actually ran. Hashing a few hundred MB takes seconds, so it is done once per version of the
files, not per run.
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
    return sorted(f for f in path.rglob("*")
                  if f.is_file() and f.name not in _SKIP and "__pycache__" not in f.parts
                  and not f.name.endswith((".py", ".pyc")))


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in model_files(path))


def _stamp(path: Path, files: list[Path]) -> str:
    parts = [f"{f.relative_to(path) if path.is_dir() else f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
             for f in files]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


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
    except (OSError, json.JSONDecodeError):
        known = {}
    hit = known.get(str(path))
    if hit and hit.get("stamp") == stamp:
        return hit["digest"]
    digest = hash_files(path, files)
    known[str(path)] = {"stamp": stamp, "digest": digest}
    tmp = index.with_name(f"digests.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, index)  # atomic: a concurrent writer loses at most a cache entry, never the file
    return digest
