"""The run log's schema: an append-only list of migrations (as in simonw/llm: never edit one that
has shipped, add the next), the columns of a job's row, and the statements that write them.
"""

from __future__ import annotations

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
    # 4: rows written at a job's start (status 'running') name the process that runs it, so a
    #    reader can tell a live job from a killed one; the partial index finds them cheaply
    """
    ALTER TABLE runs ADD COLUMN host TEXT;
    ALTER TABLE runs ADD COLUMN pid INTEGER;
    ALTER TABLE runs ADD COLUMN pid_start TEXT;
    CREATE INDEX runs_running ON runs(status) WHERE status = 'running';
    """,
    # 5: the texts of a job (prompts and answers, transcripts) unless text logging is off;
    #    the full-text index over them (FTS5) is made beside it where SQLite has FTS5
    """
    CREATE TABLE run_texts (
        run_id TEXT NOT NULL,
        item INTEGER NOT NULL,
        role TEXT NOT NULL,
        text TEXT NOT NULL
    );
    CREATE INDEX run_texts_run ON run_texts(run_id);
    """,
]

COLUMNS = (
    "id",
    "started_at",
    "task",
    "model",
    "model_path",
    "model_digest",
    "model_source",
    "runtime",
    "device",
    "dtype",
    "options",
    "input_digest",
    "inputs",
    "summary",
    "metrics",
    "versions",
    "status",
    "error",
    "chain_id",
    "stage",
    "notes",
    "host",
    "pid",
    "pid_start",
)
JSON_COLUMNS = {"options", "metrics", "versions", "notes"}
UPSERT = (
    f"INSERT INTO runs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    f"ON CONFLICT(id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
)
FTS = (
    "CREATE VIRTUAL TABLE run_texts_fts USING fts5(text, content='run_texts', content_rowid='rowid', "
    "tokenize='unicode61 remove_diacritics 2')"
)
