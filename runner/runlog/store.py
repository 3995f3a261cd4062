"""The run log: every job, failed and killed ones included, in one SQLite file.

Schema changes are an append-only list of migrations (as in simonw/llm): never edit one that has
shipped, add the next. WAL mode and a busy timeout let several processes append at once without
losing rows.

A job writes its row twice, each a short transaction: at its start (status ``running``, with the
process that runs it) and at its end (the whole row). A job killed in between (SIGKILL, a power
cut) keeps its ``running`` row; readers show it as ``interrupted`` once its process is gone
(:mod:`taskrun.runner.runlog.liveness`).

The log never blocks work: a log that cannot be opened or written (damaged, read-only, a full disk,
locked for longer than the busy timeout) is reported once on stderr, naming the file, why, and how
to move it aside, and the job runs unlogged. Reading such a log (`run logs`) is a one-line error
(:class:`LogUnavailable`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taskrun.runner.runlog import liveness
from taskrun.runner.runlog.faults import fix as _fix
from taskrun.runner.runlog.faults import why
from taskrun.runner.runlog.schema import COLUMNS, FTS, JSON_COLUMNS, MIGRATIONS, UPSERT
from taskrun.tasks.base import TaskError

TEXT_LIMIT = 256 * 1024  # characters kept of one text (a prompt, an answer, a transcript)
DEFAULT_TIMEOUT_S = 30.0

# `run --no-log-text` sets this for the command it runs (and resets it after): it wins over the
# environment and the config.
text_override: bool | None = None


class LogUnavailable(TaskError):
    """The run log cannot be read: the message names the file, why, and how to move it aside."""


def default_path() -> Path:
    env = os.environ.get("TASKRUN_LOG_DB")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("taskrun")) / "runs.db"


def text_logging() -> bool:
    """Whether jobs' texts are kept: `--no-log-text`, else $TASKRUN_LOG_TEXT (0/false/no/off),
    else ``[log] text = false`` in the config (models.toml), else on."""
    if text_override is not None:
        return text_override
    env = os.environ.get("TASKRUN_LOG_TEXT", "").strip().lower()
    if env:
        return env not in ("0", "false", "no", "off")
    try:
        from taskrun.models.resolve import load_config

        return bool((load_config().get("log") or {}).get("text", True))
    except Exception:  # a broken config is reported where models are read, not here
        return True


def lock_timeout() -> float:
    """How long a write waits for another process's lock ($TASKRUN_LOG_TIMEOUT seconds, default 30)."""
    try:
        return max(0.0, float(os.environ.get("TASKRUN_LOG_TIMEOUT", DEFAULT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_TIMEOUT_S


class RunLog:
    def __init__(self, path: str | Path | None = None, *, keep_text: bool | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.keep_text = text_logging() if keep_text is None else keep_text
        self.timeout = lock_timeout()
        self.problem: tuple[str, str] | None = None  # (kind, words) when the log cannot be used
        self.fts = False  # whether `run logs --search` has the FTS5 index
        self._warned: set[str] = set()
        self._lock = threading.Lock()  # one connection, shared by a server's worker threads
        self._conn: sqlite3.Connection | None = None
        self._conn_pid = 0
        self._reopen()

    def _reopen(self) -> None:
        try:
            self._open()
            self.problem = None
        except (sqlite3.Error, OSError) as exc:
            self._drop()
            self.problem = why(exc, self.timeout)
            self.timeout = min(self.timeout, 1.0)  # one long wait per process is enough

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Private (0600): the log holds options (prompts, system texts), results and texts.
        # SQLite gives its -wal and -shm files the database file's mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        db = self._db()
        if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            db.execute("PRAGMA journal_mode=WAL")
        self._migrate(db)

    def _db(self) -> sqlite3.Connection:
        """This process's connection, kept open: closing the last connection checkpoints the WAL
        and fsyncs (~20 ms on a busy disk), which a job's two rows would pay twice. A connection
        is never used across fork (a forked child opens its own)."""
        if self._conn is None or self._conn_pid != os.getpid():
            self._conn, self._conn_pid = self._connect(), os.getpid()
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None and self._conn_pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        """Close this process's connection now (it is otherwise closed when garbage-collected)."""
        with self._lock:
            self._drop()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
        # In WAL mode, NORMAL keeps every committed row through a crash of the process (SIGKILL);
        # only a power cut can lose the last few. It spares an fsync per row.
        db.execute("PRAGMA synchronous=NORMAL")
        db.row_factory = sqlite3.Row
        return db

    def _migrate(self, db: sqlite3.Connection) -> None:
        want_fts = _has_fts5(db)
        if self._current(db, want_fts):  # the usual case: no write lock taken at all
            self.fts = want_fts
            return
        # BEGIN IMMEDIATE: two processes starting at once must not both apply migration N.
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for i, sql in enumerate(MIGRATIONS[version:], start=version + 1):
                for stmt in filter(str.strip, sql.split(";")):
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version = {i}")
            if want_fts and not _table(db, "run_texts_fts"):
                db.execute(FTS)  # texts logged where FTS5 was missing are indexed now
                db.execute("INSERT INTO run_texts_fts(run_texts_fts) VALUES ('rebuild')")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.fts = want_fts

    @staticmethod
    def _current(db: sqlite3.Connection, want_fts: bool) -> bool:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        return version >= len(MIGRATIONS) and (not want_fts or _table(db, "run_texts_fts"))

    # ------------------------------------------------------------------ writing: never raises

    def _warn(self, kind: str, words: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        print(
            f"warning: run log {self.path}: {words}; the job runs but is not logged; {_fix(self.path, kind)}",
            file=sys.stderr,
            flush=True,
        )

    def _write(self, fn: Callable[[sqlite3.Connection], None]) -> bool:
        if self.problem is not None:  # tried again each time: a server logs again once it is fixed
            with self._lock:
                self._reopen()
            if self.problem is not None:
                self._warn(*self.problem)
                return False
        with self._lock:
            try:
                db = self._db()
                db.execute("BEGIN IMMEDIATE")
                try:
                    fn(db)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
                return True
            except (sqlite3.Error, OSError) as exc:
                self._drop()  # the next write starts on a fresh connection, with the shorter wait
                kind, words = why(exc, self.timeout)
                self._warn(kind, words)
                self.timeout = min(self.timeout, 1.0)  # one long wait per process is enough
                return False

    def append(self, row: dict[str, Any]) -> bool:
        """Write ``row`` (a new run, or the end of one that began): False when it could not be.

        ``row["texts"]`` (item, role, text) go to the texts table; a row that carries that key
        (even empty) is a text task's, and without text logging its summary and text options
        (system prompt, chat history) are left out too."""
        if not self.keep_text and row.get("texts") is not None:
            row = private(row)
        values = []
        for col in COLUMNS:
            v = row.get(col)
            values.append(json.dumps(v, default=str) if col in JSON_COLUMNS and v is not None else v)
        texts = row.get("texts") if self.keep_text and row.get("status") != "running" else None

        def write(db: sqlite3.Connection) -> None:
            db.execute(UPSERT, values)
            for item, role, text in texts or ():
                cur = db.execute(
                    "INSERT INTO run_texts (run_id, item, role, text) VALUES (?, ?, ?, ?)",
                    (row["id"], item, role, text[:TEXT_LIMIT]),
                )
                if self.fts:
                    db.execute(
                        "INSERT INTO run_texts_fts(rowid, text) VALUES (?, ?)", (cur.lastrowid, text[:TEXT_LIMIT])
                    )

        return self._write(write)

    # ------------------------------------------------------------------ reading: LogUnavailable

    def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self.problem is None:
            with self._lock:
                try:
                    db = self._db()
                    self._settle(db)
                    return fn(db)
                except (sqlite3.Error, OSError) as exc:
                    self._drop()
                    self.problem = why(exc, self.timeout)
        kind, words = self.problem
        raise LogUnavailable(f"cannot read the run log {self.path}: {words}; {_fix(self.path, kind)}")

    def _settle(self, db: sqlite3.Connection) -> None:
        """Mark ``running`` rows whose process is gone as interrupted (a best effort: a log this
        process may not write is still read, with the rows shown as they are)."""
        rows = db.execute("SELECT id, host, pid, pid_start FROM runs WHERE status = 'running'").fetchall()
        gone = [r["id"] for r in rows if liveness.gone(r["host"], r["pid"], r["pid_start"])]
        if not gone:
            return
        db.execute("PRAGMA busy_timeout=200")  # a reader never waits long for this
        try:
            db.executemany(
                "UPDATE runs SET status = 'interrupted', error = ? WHERE id = ? AND status = 'running'",
                [(liveness.GONE, i) for i in gone],
            )
        except sqlite3.Error:  # shown as they are; a later reader marks them
            pass
        finally:
            db.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")

    def version(self) -> int:
        return self._read(lambda db: db.execute("PRAGMA user_version").fetchone()[0])

    def recent(self, n: int = 20, task: str | None = None, chain_id: str | None = None) -> list[dict]:
        where, args = [], []
        if task:
            where.append("task = ?")
            args.append(task)
        if chain_id:
            where.append("chain_id = ?")
            args.append(chain_id)
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY started_at DESC, rowid DESC LIMIT ?"
        return self._read(lambda db: [self._decode(r) for r in db.execute(sql, (*args, n))])

    def get(self, run_id: str) -> dict | None:
        """One run by id, or by a unique prefix of its id."""
        rows = self._read(
            lambda db: db.execute("SELECT * FROM runs WHERE id LIKE ? LIMIT 2", (run_id + "%",)).fetchall()
        )
        return self._decode(rows[0]) if len(rows) == 1 else None

    def texts(self, run_id: str) -> list[dict]:
        """The texts kept for a run, in item order: ``{"item", "role", "text"}``."""
        return self._read(
            lambda db: [
                dict(r)
                for r in db.execute(
                    "SELECT item, role, text FROM run_texts WHERE run_id = ? ORDER BY item, rowid", (run_id,)
                )
            ]
        )

    def search(self, text: str, n: int = 20, task: str | None = None) -> list[dict]:
        """Runs whose texts hold every word of ``text``, newest first (FTS5; without it, a slower
        substring scan)."""
        from taskrun.runner.runlog.search import search

        return self._read(lambda db: [self._decode(r) for r in search(db, self.fts, text, n, task)])

    def count(self) -> int:
        return self._read(lambda db: db.execute("SELECT count(*) FROM runs").fetchone()[0])

    @staticmethod
    def _decode(row: sqlite3.Row) -> dict:
        d = dict(row)
        for col in JSON_COLUMNS:
            if d.get(col):
                d[col] = json.loads(d[col])
        return d


TEXT_OPTIONS = ("system", "history")  # options that carry the user's words


def private(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without the user's words: no texts, no summary (it quotes the answer), and the
    text options replaced by a marker."""
    options = row.get("options")
    if isinstance(options, dict):
        options = {k: (NOT_LOGGED if k in TEXT_OPTIONS and v else v) for k, v in options.items()}
    return {**row, "texts": None, "summary": NOT_LOGGED if row.get("summary") else None, "options": options}


NOT_LOGGED = "(text not logged)"


def _table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def _has_fts5(db: sqlite3.Connection) -> bool:
    return any("FTS5" in r[0] for r in db.execute("PRAGMA compile_options"))
