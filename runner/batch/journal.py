"""The output file of `run batch`: one JSON line per finished item, appended, flushed and synced,
so that the file itself is the record of what is done.

- Each finished job's lines go out in one ``write`` on an ``O_APPEND`` descriptor, then
  ``fsync``: a ``kill -9`` loses only the items still running, never a written line (the data is
  in the kernel once ``write`` returns), and the fsync keeps them through a power cut too. One
  fsync costs ~0.3 ms here (ext4), once per job, not per item: under 0.1% of an embedding job of
  256 texts, and nothing next to a transcript.
- Each line ends with ``"crc"``: the CRC-32 of the line as it was before that field was added
  (``_sealed``), so a line damaged anywhere (cut to its first bytes, a byte flipped in the result)
  is not counted done. On resume every damaged line, torn last line or damaged middle one, is
  moved out of the output into ``OUT.damaged`` (appended: nothing is lost) and its item runs
  again; lines written by a taskrun without checksums are read by a full parse (and must end
  with the key such lines ended with, so a line whose checksum key lost a byte is not one).
- A write that fails (a full disk, an immutable file) is a clear error naming the file, and any
  part of the lines it wrote is cut off again, so the file holds whole lines only.
- The ids in the file are the items already done: a rerun skips them. ``--restart`` empties the
  file first; ``--retry-failed`` keeps only the succeeded lines (rewritten atomically) so the
  failed items run again and every id is in the file once.
- An exclusive lock on the file keeps two `run batch` processes from writing it at once.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterable
from pathlib import Path

from taskrun.tasks.base import TaskError

# The fixed key order the writer uses puts each line's id and outcome first, so a resume reads
# them without parsing the (large) result; anything else falls back to a full parse.
_NATIVE = re.compile(rb'^\{"id": ("(?:[^"\\]|\\.)*"), "task": "[a-z]+", "status": "(ok|failed)"')
_OPENAI = re.compile(rb'^\{"id": "[^"]*", "custom_id": ("(?:[^"\\]|\\.)*"), "response": \{"status_code": (\d+)')


_LAST = ("run_id", "error")  # the last key of a taskrun line and of an OpenAI line, before checksums
_CRC = re.compile(rb', "crc": "([0-9a-f]{8})"\}\n\Z')


def _tail(raw: bytes) -> re.Match | None:
    return _CRC.search(raw, max(0, len(raw) - 24))


def sealed(obj: dict) -> bytes:
    """``obj`` as an output line, its CRC-32 appended as the last field."""
    body = json.dumps(obj, ensure_ascii=False).encode()
    return body[:-1] + b', "crc": "%08x"}\n' % zlib.crc32(body)


def checked(raw: bytes) -> bytes | None:
    """The line without its checksum field when the checksum matches; None when it does not; the
    line itself when it has none (written before checksums)."""
    m = _tail(raw)
    if m is None:
        return raw if b'"crc": ' not in raw else None
    body = raw[: m.start()] + b"}"
    return body + b"\n" if b"%08x" % zlib.crc32(body) == m.group(1) else None


def line_key(raw: bytes, *, need_crc: bool = False) -> tuple[str, bool, str] | None:
    """(id, succeeded, format) of one output line; None when it is not a whole, intact output
    line (``need_crc``: a line without a checksum is not intact either)."""
    if not raw.endswith(b"\n"):
        return None
    if _tail(raw) is None:  # no checksum: intact only if the whole line parses, ending as lines did
        if need_crc or b'"crc": ' in raw:
            return None
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(obj, dict) or not obj or list(obj)[-1] not in _LAST:
            return None  # e.g. a line whose "crc" key lost a byte
    else:
        plain = checked(raw)
        if plain is None:
            return None
        raw = plain
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
        self.damaged: tuple[int, list[int], str] | None = None  # (lines, first line numbers, side file)
        if not self.path.resolve().parent.is_dir():
            raise TaskError(f"cannot write {path}: folder {self.path.resolve().parent} does not exist; create it first")
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise TaskError(
                f"cannot write {path} ({exc.strerror or exc}): make it writable (`lsattr` shows an "
                f"immutable file, `chattr -i` clears it), or give another -o"
            ) from None
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
        """The ids already written. Every damaged line is moved to ``OUT.damaged`` and its item
        runs again: a torn tail is cut off, damaged middle lines are removed by rewriting the file
        (atomically) with its intact lines only."""
        done: dict[str, bool] = {}
        bad: list[tuple[int, bytes]] = []
        with open(self.path, "rb") as f:  # one file, one writer: checksums on every line, or on none
            need_crc = any(_tail(raw) is not None for raw in f)
        good_end = pos = 0
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, 1):
                pos += len(raw)
                if not raw.strip():
                    if not bad:
                        good_end = pos
                    continue
                key = line_key(raw, need_crc=need_crc)
                if key is None or key[0] in done:  # a second copy of an id: kept once
                    bad.append((n, raw))
                    continue
                self._check_format(key[2], n)
                done[key[0]] = key[1]
                if not bad:
                    good_end = pos
        if bad:
            self._set_aside(bad, good_end, pos, need_crc)
        return done

    def _set_aside(self, bad: list[tuple[int, bytes]], good_end: int, size: int, need_crc: bool) -> None:
        side = self.path.with_name(self.path.name + ".damaged")
        try:  # kept before the output changes: a failure here leaves the output as it was
            fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            with open(fd, "ab") as f:
                for _, raw in bad:
                    f.write(raw if raw.endswith(b"\n") else raw + b"\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise TaskError(
                f"{len(bad)} damaged line(s) in {self.path} (line {bad[0][0]}) could not be set "
                f"aside in {side} ({exc.strerror or exc}); nothing was changed: free space or fix "
                f"that file, then run again"
            ) from None
        self.dropped_bytes = sum(len(r) for _, r in bad)
        self.damaged = (len(bad), [n for n, _ in bad[:10]], str(side))
        if sum(len(r) for _, r in bad) == size - good_end:  # only a torn tail: cut it
            os.ftruncate(self.fd, good_end)
            return
        seen: set[str] = set()

        def intact(raw: bytes) -> bool:
            key = line_key(raw, need_crc=need_crc) if raw.strip() else None
            if key is None or key[0] in seen:
                return False
            seen.add(key[0])
            return True

        self._rewrite(intact)

    def _rewrite(self, keep) -> None:
        """Rewrite the file with the lines ``keep`` accepts, atomically (a copy, synced, renamed
        over it), and reopen and lock the new file."""
        tmp = self.path.with_name(f".{self.path.name}.rewrite.tmp")
        try:
            with open(self.path, "rb") as src, open(tmp, "wb") as dst:
                for raw in src:
                    if keep(raw):
                        dst.write(raw)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise TaskError(
                f"could not rewrite {self.path} ({exc.strerror or exc}); it is unchanged: free "
                f"space (or make its folder writable) and run again"
            ) from None
        os.close(self.fd)  # the old descriptor is the replaced file: reopen and lock the new one
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o644)
        self._lock()

    def _check_format(self, fmt: str, n: int) -> None:
        if fmt != self.flavour:
            raise TaskError(
                f"{self.path} holds {fmt}-format lines (line {n}), not the {self.flavour} lines "
                f"this input gives: it is another batch's output; give another -o, or --restart"
            )

    def _keep_succeeded(self) -> None:
        """Keep the succeeded lines only, so the failed items run again and each id stays in the
        file once."""

        def succeeded(raw: bytes) -> bool:
            key = line_key(raw) if raw.strip() else None
            return key is not None and key[1]

        self._rewrite(succeeded)
        self.done = {k: ok for k, ok in self.done.items() if ok}

    def write(self, lines: Iterable[dict]) -> int:
        """Append whole lines in one write, then fsync. Returns how many were written. A failed
        write is a TaskError naming the file, and the file is cut back to its whole lines."""
        chunks = [sealed(obj) for obj in lines]
        if not chunks:
            return 0
        data = memoryview(b"".join(chunks))
        start = os.fstat(self.fd).st_size
        try:
            while data:
                data = data[os.write(self.fd, data) :]
            os.fsync(self.fd)
        except OSError as exc:
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass  # the resume cuts the torn tail instead
            raise TaskError(
                f"could not write to {self.path} ({exc.strerror or exc}): the lines written so far "
                f"are kept; free space (or make the file writable) and run the same command again "
                f"to resume"
            ) from None
        return len(chunks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
