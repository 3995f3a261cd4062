"""The one path by which taskrun writes a whole file it was told to write: -o, chat's /save, batch
and transcribe side files (--out-dir), chain artifacts. Each write is checked at the moment it
happens, not only before the job, because the file may change while a model runs:

- a symbolic link is refused (the rename would replace the link itself, not what it points to);
- a device or other special file is refused (``/save /dev/null`` as root would otherwise replace
  the system's /dev/null with a regular file);
- a file that is one of the job's inputs is refused by inode, not by name: a hard link or a link
  to the input *is* the input;
- the data goes to a temporary file in the same folder, synced, then renamed over the target
  (``atomic_write``): a failure never leaves half a file.

``file_name`` turns an item id into a file name that two ids never share: a name that had to be
changed to be safe (``..``, ``.``, ``a b``) or one too long for the file system gets a short hash
of the whole id, so ``..``, ``.`` and ``...`` no longer all write ``item.srt``.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path, PurePosixPath

from taskrun.runner.output.terminal import for_terminal
from taskrun.tasks.base import TaskError, atomic_write

# Longest file-name component kept as is (bytes); ext4, xfs and btrfs allow 255.
MAX_NAME = 200
_UNSAFE = re.compile(r"[^\w.-]")


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one file (same device and inode; links followed)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_target(path: str | Path, inputs: tuple[str | Path, ...] = (), *, what: str = "-o") -> None:
    """Raise a TaskError naming ``what`` unless ``path`` may be replaced by a whole-file write."""
    p = Path(path)
    shown = for_terminal(str(path), 200)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    except OSError as exc:  # a name too long, a file in place of a folder on the way
        raise TaskError(f"cannot write {shown}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise TaskError(
            f"{what} {shown} is a symbolic link (to {for_terminal(os.readlink(p), 200)}); taskrun "
            f"would replace the link itself. Give the file it points to, or remove the link"
        )
    if stat.S_ISDIR(st.st_mode):
        raise TaskError(f"{what} {shown} is a folder; name a file in it, e.g. {shown.rstrip('/')}/out.txt")
    if not stat.S_ISREG(st.st_mode):
        raise TaskError(
            f"{what} {shown} is a device or special file, not a regular file; taskrun writes "
            f"whole files only into regular files. Give another path"
        )
    for src in inputs:
        if src and same_file(p, src):
            raise TaskError(
                f"{what} {shown} is also an input of this job (the same file, by inode: a link "
                f"to the input is the input); writing it would replace the input. Pick another name"
            )


def write_file(
    path: str | Path,
    data: str | bytes,
    *,
    inputs: tuple[str | Path, ...] = (),
    what: str = "-o",
    private: bool = False,
) -> None:
    """Check ``path`` (``check_target``) and write ``data`` to it whole, or raise a TaskError that
    names the file and why (a full disk, a read-only folder) and leave any old file as it was."""
    check_target(path, inputs, what=what)
    try:
        atomic_write(path, data, private=private)
    except OSError as exc:
        raise TaskError(
            f"could not write {for_terminal(str(path), 200)} ({exc.strerror or exc}); free space or pick another path"
        ) from None


def _short(part: str, item_id: str, changed: bool) -> str:
    digest = hashlib.sha256(item_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    if len(part.encode()) > MAX_NAME:
        return part.encode()[:MAX_NAME].decode("utf-8", "ignore") + f"-{digest}"
    return f"{part}-{digest}" if changed else part


def file_name(folder: str | Path, item_id: str, suffix: str) -> Path:
    """Where an item's file goes under ``folder``: its id as a relative path (``sub/a.wav`` →
    ``folder/sub/a.wav.srt``, a folder's layout kept), never outside ``folder``; distinct ids get
    distinct names (a name changed to be safe carries a hash of the id), and no component is
    longer than the file system allows."""
    raw = [p for p in PurePosixPath(item_id.replace("\\", "/")).parts if p != "/"]
    parts = [_UNSAFE.sub("_", p) for p in raw if p.strip(".")]
    changed = "/".join(parts) != item_id  # "." has no parts at all: changed too
    if not parts:
        parts = ["item"]
    parts = [_short(p, item_id, False) for p in parts[:-1]] + [_short(parts[-1], item_id, changed)]
    last = parts[-1]
    if len((last + suffix).encode()) > 255:
        parts[-1] = _short(last[: MAX_NAME // 2], item_id, True)
    return Path(folder).joinpath(*parts[:-1], parts[-1] + suffix)
