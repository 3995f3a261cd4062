"""The record of what taskrun wrote into its cache folder: ``<cache>/.taskrun-written``, one entry
name a line (``gguf/<digest>``, ``joined/<name>``, ``digests.json``...), appended when taskrun
writes that entry. `run cache prune --all` (and ``--older-than``) removes only entries named
here, so a ``TASKRUN_CACHE_DIR`` shared with the user's own files (a ``gguf/my-model.gguf`` of
theirs) loses none of them. A record that cannot be written leaves the entry unrecorded: it is
then kept by ``--all``, and removed only when named (the safe side).
"""

from __future__ import annotations

import os
from pathlib import Path

RECORD = ".taskrun-written"


def entry_name(root: Path, path: Path) -> str:
    """The cache entry ``path`` belongs to: ``FOLDER/NAME`` for an entry inside a kind's folder,
    else the top-level name."""
    rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).parts
    return "/".join(rel[:2]) if len(rel) >= 2 else rel[0]


def note_written(path: Path, root: Path) -> None:
    """Record that taskrun wrote the entry at ``path`` (under ``root``, the cache folder)."""
    try:
        name = entry_name(root, path)
    except ValueError:  # not under the cache folder (a temporary build)
        return
    if name in written(root):
        return
    try:
        fd = os.open(root / RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, (name + "\n").encode())  # one short append: whole even with writers at once
        finally:
            os.close(fd)
    except OSError:
        pass


def written(root: Path) -> set[str]:
    """The entry names taskrun recorded writing under ``root``."""
    try:
        with open(root / RECORD, encoding="utf-8", errors="replace") as f:
            return {line.rstrip("\n") for line in f if line.strip()}
    except OSError:
        return set()


def forget(root: Path, names: set[str]) -> None:
    """Drop ``names`` from the record (their entries were removed), atomically."""
    keep = written(root) - names
    if not keep:  # nothing of taskrun's is left: the record goes too, leaving the folder as found
        (root / RECORD).unlink(missing_ok=True)
        return
    tmp = root / f"{RECORD}.{os.getpid()}.tmp"
    try:
        tmp.write_text("".join(f"{n}\n" for n in sorted(keep)), encoding="utf-8")
        os.replace(tmp, root / RECORD)
    except OSError:
        tmp.unlink(missing_ok=True)
