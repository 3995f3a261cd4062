"""The search index: each corpus file's passages and their vectors, kept in one SQLite file in the
cache folder and shared by `run search` and `run ask` (whose first step is a search).

A row is keyed by the file's path within a *space* (everything else the vectors depend on: the
model's digest, runtime and dtype, and the splitting settings) and carries the digest of the text
it was made from. An unchanged file is reused as it is; a changed one is embedded again; a file gone
from the corpus drops out. SQLite as the run log uses it: WAL and a busy timeout, so concurrent
searches share the file. Vectors are scored by brute force in memory (see search.py), which is
fine to about 10^5 passages (150 MB of 384-d float32); beyond that a vector store (sqlite-vec,
usearch, hnswlib) would pay.

The file is private (0600): it holds the text of the user's documents. It is a cache, and heals:
a file that SQLite cannot read (not a database, a torn or truncated page, found when it is opened or
later while reading) is deleted and rebuilt; a row whose vectors do not match their CRC-32 or their
passage count is embedded again; the caller says so in one line. A cache that cannot be written (a
read-only or full disk) never fails the search: the results stand, the index is not kept, and the
caller says that once too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import zlib
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCHEMA_VERSION = 2  # 2: a CRC-32 of each row's vectors
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    space TEXT NOT NULL,      -- model digest, runtime, dtype, splitter version and passage size
    path TEXT NOT NULL,       -- the file, absolute
    digest TEXT NOT NULL,     -- sha256 of the text the passages were cut from
    passages TEXT NOT NULL,   -- JSON: [[line_start, line_end, text], ...]
    dim INTEGER NOT NULL,
    vectors BLOB NOT NULL,    -- float32, (len(passages), dim), row-major
    crc INTEGER NOT NULL,     -- zlib.crc32 of vectors: a damaged row is embedded again
    PRIMARY KEY (space, path)
);
CREATE TABLE IF NOT EXISTS spaces (
    root TEXT NOT NULL,       -- a corpus folder
    space TEXT NOT NULL,
    used REAL NOT NULL,       -- when a search last used this space on this folder (time.time())
    PRIMARY KEY (root, space)
)
"""
MAX_SPACES = 4  # settings (model, passage size...) kept per corpus folder; the least recently used goes


@dataclass
class Entry:
    """One file as the index holds it."""

    digest: str
    passages: list[tuple[int, int, str]]  # (line_start, line_end, text)
    vectors: np.ndarray  # float32 (n, dim)


class CorpusIndex:
    """The index file. ``damaged`` holds what was wrong when (part of) it had to be rebuilt;
    ``unsaved`` why it could not be written (the search still returns its results)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.damaged: str | None = None
        self.unsaved: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._open()
            from taskrun.models.cache_record import note_written
            from taskrun.models.resolve import cache_dir

            note_written(path, cache_dir())  # in taskrun's cache: `run cache prune --all` may remove it
        except (OSError, sqlite3.OperationalError) as exc:  # a cache that cannot be written
            self.unsaved = _why(exc)

    def _open(self) -> None:
        try:
            self._prepare()
        except sqlite3.DatabaseError as exc:
            if _unwritable(exc):
                raise
            self._rebuild(exc)

    def _rebuild(self, exc: Exception) -> None:
        """Not a database, or a torn page: it is only a cache. Start a new one."""
        self.damaged = self.damaged or str(exc)
        for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            p.unlink(missing_ok=True)
        self._prepare()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def _prepare(self) -> None:
        # Created 0600 before SQLite opens it; SQLite gives its -wal and -shm files the same mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        with closing(self._connect()) as db:
            db.execute("PRAGMA journal_mode=WAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:  # an index from another taskrun: start over
                db.execute("DROP TABLE IF EXISTS files")
            db.executescript(SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("SELECT count(*) FROM files").fetchone()  # reads the pages: damage shows here

    def entries(self, space: str, paths: list[str]) -> dict[str, Entry]:
        """What the index holds for ``paths`` in ``space``: rows that check out (a damaged row is
        left out, so its file is embedded again, and noted in ``damaged``)."""
        if self.unsaved:
            return {}
        try:
            return self._entries(space, paths)
        except sqlite3.DatabaseError as exc:  # damage found while reading the pages
            if _unwritable(exc):
                self.unsaved = _why(exc)
                return {}
            try:
                self._rebuild(exc)
            except (OSError, sqlite3.Error) as again:
                self.unsaved = _why(again)
            return {}

    def _entries(self, space: str, paths: list[str]) -> dict[str, Entry]:
        out: dict[str, Entry] = {}
        with closing(self._connect()) as db:
            for i in range(0, len(paths), 500):  # SQLite's limit on bound parameters
                part = paths[i : i + 500]
                rows = db.execute(
                    f"SELECT path, digest, passages, dim, vectors, crc FROM files WHERE space = ? "
                    f"AND path IN ({','.join('?' * len(part))})",
                    (space, *part),
                )
                for path, digest, passages, dim, blob, crc in rows:
                    entry = _entry(digest, passages, dim, blob, crc)
                    if entry is None:
                        self.damaged = self.damaged or f"the entry for {path} was damaged"
                        continue
                    out[path] = entry
        return out

    def update(self, space: str, changed: dict[str, Entry], keep: set[str], root: str | None) -> int:
        """Store ``changed`` files; drop the files under ``root`` (a corpus folder) that are not in
        ``keep`` any more. Returns how many were dropped. One transaction: a concurrent search sees
        the index before or after, never half of it."""
        if self.unsaved:
            return 0
        try:
            return self._update(space, changed, keep, root)
        except (OSError, sqlite3.Error) as exc:  # a full or read-only disk: the results stand
            self.unsaved = _why(exc)
            return 0

    def _update(self, space: str, changed: dict[str, Entry], keep: set[str], root: str | None) -> int:
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT OR REPLACE INTO files (space, path, digest, passages, dim, vectors, crc) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [_row(space, path, e) for path, e in changed.items()],
                )
                gone = []
                if root is not None:
                    prefix = root.rstrip(os.sep) + os.sep
                    rows = db.execute(
                        "SELECT path FROM files WHERE space = ? AND substr(path, 1, ?) = ?",
                        (space, len(prefix), prefix),
                    )
                    gone = [p for (p,) in rows if p not in keep]
                    db.executemany("DELETE FROM files WHERE space = ? AND path = ?", [(space, p) for p in gone])
                    _forget_old_spaces(db, root.rstrip(os.sep), prefix, space)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return len(gone)


def _forget_old_spaces(db: sqlite3.Connection, root: str, prefix: str, space: str) -> None:
    """Keep the MAX_SPACES most recently used spaces of the folder ``root``: each passage size a
    client asks for is a whole copy of the corpus's vectors, so without a bound requests could
    grow the file without end (issue 33)."""
    import time

    db.execute("INSERT OR REPLACE INTO spaces (root, space, used) VALUES (?, ?, ?)", (root, space, time.time()))
    old = [
        s
        for (s,) in db.execute(
            "SELECT space FROM spaces WHERE root = ? ORDER BY used DESC LIMIT -1 OFFSET ?", (root, MAX_SPACES)
        )
    ]
    for s in old:
        db.execute("DELETE FROM files WHERE space = ? AND substr(path, 1, ?) = ?", (s, len(prefix), prefix))
        db.execute("DELETE FROM spaces WHERE root = ? AND space = ?", (root, s))


def _row(space: str, path: str, e: Entry) -> tuple:
    blob = np.ascontiguousarray(e.vectors, np.float32).tobytes()
    return (
        space,
        path,
        e.digest,
        json.dumps(e.passages, ensure_ascii=False),
        e.vectors.shape[1],
        blob,
        zlib.crc32(blob),
    )


def _entry(digest, passages, dim, blob, crc) -> Entry | None:
    """A row as an Entry, or None when it does not check out (its vectors' CRC-32, their shape
    against the passages)."""
    try:
        if zlib.crc32(blob) != crc:
            return None
        cut = [tuple(p) for p in json.loads(passages)]
        vecs = np.frombuffer(blob, np.float32).reshape(-1, dim)
        return Entry(digest, cut, vecs) if len(vecs) == len(cut) else None
    except (TypeError, ValueError):
        return None


def _unwritable(exc: Exception) -> bool:
    """SQLite's errors for a disk that is full or read-only (the file itself may be sound)."""
    text = str(exc).lower()
    return any(w in text for w in ("disk is full", "readonly", "read-only", "unable to open", "disk i/o"))


def _why(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc)
