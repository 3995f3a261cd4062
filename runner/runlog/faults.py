"""A run log that cannot be used, in words: what is wrong with it and what the user can do.

The kinds: ``locked`` (another process held it past the busy timeout), ``damaged`` (not a
database, or malformed), ``readonly``, ``full`` (no space, or the file size limit), ``path`` (the
path cannot hold a file: a folder there, or a file where a folder should be) and ``other``.
"""

from __future__ import annotations

from pathlib import Path


def why(exc: BaseException, timeout: float) -> tuple[str, str]:
    """(kind, words) for a failure to open, read or write the log."""
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if isinstance(exc, (NotADirectoryError, IsADirectoryError, FileExistsError)):
        return "path", f"that path cannot hold a file ({exc.strerror}: {exc.filename})"
    if "locked" in low or "busy" in low:
        return "locked", f"another process held it locked for more than {timeout:g} s"
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return "damaged", f"it is damaged ({text})"
    if "readonly" in low or "read-only" in low or isinstance(exc, PermissionError):
        return "readonly", f"it is read-only ({text})"
    if "full" in low or "i/o error" in low or getattr(exc, "errno", None) in (27, 28):  # EFBIG, ENOSPC
        return "full", f"the disk is full or the file at its size limit ({text})"
    return "other", text


def fix(path: Path, kind: str) -> str:
    """What the user can do about it, for each kind of failure."""
    elsewhere = "or set TASKRUN_LOG_DB to a file elsewhere"
    if kind == "locked":
        return f"wait for the other process, {elsewhere}"
    if kind == "path":
        return "set TASKRUN_LOG_DB to a file in a folder (or remove what is in the way)"
    if kind == "readonly":
        return f"make it writable (chmod u+w {path} and its folder), {elsewhere}"
    if kind == "full":
        return f"free some space, {elsewhere}"
    return f"move it aside (mv {path} {path}.bad) and the next job starts a new log, {elsewhere}"
