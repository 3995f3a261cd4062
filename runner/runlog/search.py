"""`run logs --search`: runs found by the texts they kept (prompts, answers, transcripts).

With FTS5 (in nearly every SQLite build) the query is matched word by word against a full-text
index: every word must occur, in any order, case- and accent-insensitively. Each word is quoted,
so punctuation and FTS5 operators in what the user typed are plain text. Without FTS5 the same
rule runs as a substring scan of every text (slower on a big log), and taskrun says so once.
"""

from __future__ import annotations

import re
import sqlite3
import sys

_WORD = re.compile(r"\w+", re.UNICODE)


def fts_query(text: str) -> str | None:
    """The FTS5 query for ``text``: each word quoted, all of them required; None with no word."""
    words = _WORD.findall(text)
    return " ".join('"' + w.replace('"', '""') + '"' for w in words) or None


def search(db: sqlite3.Connection, fts: bool, text: str, n: int, task: str | None) -> list[sqlite3.Row]:
    where, args = "", []
    if task:
        where, args = " AND r.task = ?", [task]
    if fts:
        query = fts_query(text)
        if query is None:
            return []
        sql = (
            "SELECT r.* FROM runs r WHERE r.id IN (SELECT t.run_id FROM run_texts_fts f "
            "JOIN run_texts t ON t.rowid = f.rowid WHERE run_texts_fts MATCH ?)"
        )
        args = [query, *args]
    else:
        print("note: this Python's SQLite has no FTS5; searching the texts one by one (slower)", file=sys.stderr)
        words = _WORD.findall(text)
        if not words:
            return []
        sql = (
            "SELECT r.* FROM runs r WHERE r.id IN (SELECT run_id FROM run_texts WHERE "
            + " AND ".join("text LIKE ?" for _ in words)
            + ")"
        )
        args = [f"%{w}%" for w in words] + args
    sql += where + " ORDER BY r.started_at DESC, r.rowid DESC LIMIT ?"
    return db.execute(sql, (*args, n)).fetchall()
