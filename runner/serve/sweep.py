"""Upload folders left behind: each request's bytes live in ``taskrun-upload-PID-*`` in the temp
folder and go when its job ends, but a server killed with -9 (or the OOM killer) leaves them. A
server sweeps, when it starts, the folders of processes no longer alive (and those without a pid
in their name, from an older taskrun, once they are an hour old)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

_NAME = re.compile(r"taskrun-upload-(?:(\d+)-)?")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_uploads(root: str | Path | None = None, max_age_s: float = 3600) -> list[Path]:
    """Remove the upload folders of dead processes under ``root`` (the temp folder); returns them."""
    gone = []
    for p in Path(root or tempfile.gettempdir()).glob("taskrun-upload-*"):
        m = _NAME.match(p.name)
        try:
            if not m or not p.is_dir() or p.is_symlink() or p.stat().st_uid != os.getuid():
                continue
            pid = m.group(1)
            dead = not _alive(int(pid)) if pid else time.time() - p.stat().st_mtime > max_age_s
        except OSError:
            continue
        if dead:
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone
