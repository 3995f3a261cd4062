"""The output file of `run batch`: one JSON line per finished item, appended, flushed and synced,
so that the file itself is the record of what is done.

- Each finished job's lines go out in one ``write`` on an ``O_APPEND`` descriptor, then
  ``fsync``: a ``kill -9`` loses only the items still running, never a written line (the data is
  in the kernel once ``write`` returns), and the fsync keeps them through a power cut too. One
  fsync costs ~0.3 ms here (ext4), once per job, not per item: under 0.1% of an embedding job of
  256 texts, and nothing next to a transcript.
- A process killed inside a ``write`` can leave a last line without its newline (or a line that
  is not JSON): on resume that tail is cut off and its item runs again. A damaged line followed by
  good ones is not a torn tail; it is named, and nothing is cut.
- The ids in the file are the items already done: a rerun skips them. ``--restart`` empties the
  file first; ``--retry-failed`` keeps only the succeeded lines (rewritten atomically) so the
  failed items run again and every id is in the file once.
- An exclusive lock on the file keeps two `run batch` processes from writing it at once.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from taskrun.tasks.base import TaskError

# The fixed key order the writer uses puts each line's id and outcome first, so a resume reads
# them without parsing the (large) result; anything else falls back to a full parse.
_NATIVE = re.compile(rb'^\{"id": ("(?:[^"\\]|\\.)*"), "task": "[a-z]+", "status": "(ok|failed)"')
_OPENAI = re.compile(rb'^\{"id": "[^"]*", "custom_id": ("(?:[^"\\]|\\.)*"), "response": \{"status_code": (\d+)')


def line_key(raw: bytes) -> tuple[str, bool, str] | None:
    """(id, succeeded, format) of one output line; None when it is not a whole output line."""
    if not raw.endswith(b"\n"):
        return None
    m = _NATIVE.match(raw)
    if m:
        return json.loads(m.group(1)), m.group(2) == b"ok", "taskrun"
    m = _OPENAI.match(raw)
    if m:
        return json.loads(m.group(1)), m.group(2) == b"200", "openai"
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("custom_id"), str):
        status = (obj.get("response") or {}).get("status_code")
        return obj["custom_id"], status == 200, "openai"
    if isinstance(obj.get("id"), str) and obj.get("status") in ("ok", "failed"):
        return obj["id"], obj["status"] == "ok", "taskrun"
    return None


class Journal:
    """The output JSONL, opened for appending; ``done`` maps each id already in it to whether it
    succeeded."""

    def __init__(self, path: str | Path, *, flavour: str, restart: bool = False, retry_failed: bool = False) -> None:
        self.path = Path(path)
        self.flavour = "openai" if flavour == "openai" else "taskrun"
        self.dropped_bytes = 0
        if not self.path.resolve().parent.is_dir():
            raise TaskError(f"cannot write {path}: folder {self.path.resolve().parent} does not exist; create it first")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock()
        if restart:
            os.ftruncate(self.fd, 0)
        self.done = self._read()
        if retry_failed and not all(self.done.values()):
            self._keep_succeeded()

    def _lock(self) -> None:
        import fcntl

        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise TaskError(
                f"{self.path} is being written by another `run batch`; wait for it to end, or give another -o"
            ) from None

    def _read(self) -> dict[str, bool]:
        """The ids already written; a torn or broken last line is cut off."""
        done: dict[str, bool] = {}
        good_end = pos = 0
        bad: int | None = None
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if bad is not None:
                    raise TaskError(
                        f"line {bad} of {self.path} is damaged (not a whole JSON line) and "
                        f"is not the last line; remove it by hand, or start over with --restart"
                    )
                if raw.strip():
                    key = line_key(raw)
                    if key is None:
                        bad = n
                    else:
                        self._check_format(key[2], n)
                        done[key[0]] = key[1]
                pos += len(raw)
                if bad is None:
                    good_end = pos
        if bad is not None:
            self.dropped_bytes = pos - good_end
            os.ftruncate(self.fd, good_end)
        return done

    def _check_format(self, fmt: str, n: int) -> None:
        if fmt != self.flavour:
            raise TaskError(
                f"{self.path} holds {fmt}-format lines (line {n}), not the {self.flavour} lines "
                f"this input gives: it is another batch's output; give another -o, or --restart"
            )

    def _keep_succeeded(self) -> None:
        """Rewrite the file with its succeeded lines only (atomically: a copy, synced, renamed
        over it), so the failed items run again and each id stays in the file once."""
        tmp = self.path.with_name(f".{self.path.name}.retry.tmp")
        with open(self.path, "rb") as src, open(tmp, "wb") as dst:
            for raw in src:
                key = line_key(raw) if raw.strip() else None
                if key is not None and key[1]:
                    dst.write(raw)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, self.path)
        os.close(self.fd)  # the old descriptor is the replaced file: reopen and lock the new one
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o644)
        self._lock()
        self.done = {k: ok for k, ok in self.done.items() if ok}

    def write(self, lines: Iterable[dict]) -> int:
        """Append whole lines in one write, then fsync. Returns how many were written."""
        chunks = [json.dumps(obj, ensure_ascii=False).encode() + b"\n" for obj in lines]
        if not chunks:
            return 0
        data = memoryview(b"".join(chunks))
        while data:
            data = data[os.write(self.fd, data) :]
        os.fsync(self.fd)
        return len(chunks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
