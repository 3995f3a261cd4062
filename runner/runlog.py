"""The run log: every job, failed ones included, in one SQLite file.

Schema changes are an append-only list of migrations (as in simonw/llm): never edit one that has
shipped, add the next. WAL mode and a busy timeout let several processes append at once without
losing rows.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

MIGRATIONS: list[str] = [
    # 1: the jobs table
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        started_at TEXT NOT NULL,
        task TEXT NOT NULL,
        model TEXT,
        model_path TEXT,
        model_digest TEXT,
        model_source TEXT,
        runtime TEXT,
        device TEXT,
        dtype TEXT,
        options TEXT,
        input_digest TEXT,
        inputs INTEGER,
        summary TEXT,
        metrics TEXT,
        versions TEXT,
        status TEXT NOT NULL,
        error TEXT
    );
    CREATE INDEX runs_started ON runs(started_at);
    CREATE INDEX runs_task ON runs(task);
    """,
    # 2: chains: one row per stage, linked by chain_id, in stage order
    """
    ALTER TABLE runs ADD COLUMN chain_id TEXT;
    ALTER TABLE runs ADD COLUMN stage INTEGER;
    CREATE INDEX runs_chain ON runs(chain_id);
    """,
    # 3: what the job told the user besides its results (a model switched for the language, ...)
    """
    ALTER TABLE runs ADD COLUMN notes TEXT;
    """,
]

COLUMNS = ("id", "started_at", "task", "model", "model_path", "model_digest", "model_source", "runtime",
           "device", "dtype", "options", "input_digest", "inputs", "summary", "metrics", "versions",
           "status", "error", "chain_id", "stage", "notes")
_JSON_COLUMNS = {"options", "metrics", "versions", "notes"}


def default_path() -> Path:
    env = os.environ.get("TASKRUN_LOG_DB")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("taskrun")) / "runs.db"


class RunLog:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Private (0600): the log holds options (prompts, system texts) and result summaries.
        # SQLite gives its -wal and -shm files the database file's mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        with closing(self._connect()) as db:
            self._migrate(db)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=30000")
        db.row_factory = sqlite3.Row
        return db

    def _migrate(self, db: sqlite3.Connection) -> None:
        # BEGIN IMMEDIATE: two processes starting at once must not both apply migration N.
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for i, sql in enumerate(MIGRATIONS[version:], start=version + 1):
                for stmt in filter(str.strip, sql.split(";")):
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version = {i}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def version(self) -> int:
        with closing(self._connect()) as db:
            return db.execute("PRAGMA user_version").fetchone()[0]

    def append(self, row: dict[str, Any]) -> None:
        values = []
        for col in COLUMNS:
            v = row.get(col)
            values.append(json.dumps(v, default=str) if col in _JSON_COLUMNS and v is not None else v)
        with closing(self._connect()) as db:
            db.execute(f"INSERT INTO runs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                       values)

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
        with closing(self._connect()) as db:
            return [self._decode(r) for r in db.execute(sql, (*args, n))]

    def get(self, run_id: str) -> dict | None:
        """One run by id, or by a unique prefix of its id."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT * FROM runs WHERE id LIKE ? LIMIT 2", (run_id + "%",)).fetchall()
        return self._decode(rows[0]) if len(rows) == 1 else None

    def count(self) -> int:
        with closing(self._connect()) as db:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0]

    @staticmethod
    def _decode(row: sqlite3.Row) -> dict:
        d = dict(row)
        for col in _JSON_COLUMNS:
            if d.get(col):
                d[col] = json.loads(d[col])
        return d
