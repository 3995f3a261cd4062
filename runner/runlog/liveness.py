"""Is the process that wrote a ``running`` row still alive? A row names its host, pid and the
pid's start time; a pid that no longer exists, or that now belongs to a process started at
another time (the pid was reused), means the job was killed before it could finish its row."""

from __future__ import annotations

import functools
import os
import socket

GONE = "its process ended before the job did (killed, or the machine stopped)"


@functools.lru_cache(maxsize=1)
def host() -> str:
    return socket.gethostname()


def start_time(pid: int | None = None) -> str | None:
    """When process ``pid`` (default: this one) started, in clock ticks since boot (Linux's
    /proc/PID/stat field 22); None where there is no /proc or no such process, and for a zombie
    (a killed process its parent has not reaped yet: it will never finish its row)."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as f:
            data = f.read()
        fields = data.rsplit(b")", 1)[1].split()  # after "(comm)": field 3 (state) is index 0
        return None if fields[0] in (b"Z", b"X") else fields[19].decode()
    except (OSError, IndexError):
        return None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def gone(row_host: str | None, pid: int | None, pid_start: str | None) -> bool:
    """True when the row's process is known to be gone. A row from another host, or without a
    pid, cannot be judged from here: it stays ``running``."""
    if not pid or row_host != host():
        return False
    if pid_start is not None and os.path.isdir("/proc"):
        return start_time(pid) != pid_start
    return not _exists(pid)


def stamp() -> dict:
    """What a row written by this process says about it."""
    return {"host": host(), "pid": os.getpid(), "pid_start": _own_start()}


@functools.lru_cache(maxsize=1)
def _own_start() -> str | None:
    return start_time()
