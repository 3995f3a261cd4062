"""Converted-model cache entries that check themselves: a manifest of their files, verified on use.

taskrun converts some weights once and keeps the result in its cache folder (a GGUF dequantised to
safetensors, a CTranslate2 Whisper turned into a transformers folder). Such a folder is a file the
user never made and cannot judge, so taskrun must: each entry holds ``manifest.json`` (the source's
digest, every file's size and sha256, and the digest of the whole folder — what actually runs), and
every use checks it:

* cheaply, always: every file is there with its size, small files (≤ 1 MiB: configs, tokenizers)
  match their sha256, and big files match a digest of 8 sampled 64 KiB blocks (header, tail and six
  between) — about a millisecond;
* fully (every byte against its sha256) whenever the files' (size, mtime, inode, ctime) changed since
  the last full check, which the entry records in ``.verified``: a write into the folder after the
  entry was made (random bytes inside model.safetensors) or an entry left by a crash is caught,
  while an untouched entry costs only a ``stat`` per file.

A damaged entry is removed and rebuilt, and :func:`warn_rebuilt` says so in one line on stderr.
Entries are built in a temporary folder next to their final place (``.NAME.tmp-PID-…``) and renamed;
:func:`clean_stale` removes temporary folders whose process is gone or that are older than an hour.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from taskrun.tasks.base import TaskError

MANIFEST = "manifest.json"
VERIFIED = ".verified"
SMALL = 1 << 20  # files up to this size are hashed whole on every use
BLOCK = 1 << 16
SAMPLES = 8
STALE_S = 3600.0


def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file() and f.name not in (MANIFEST, VERIFIED))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _sampled(path: Path, size: int) -> str:
    """sha256 of SAMPLES blocks spread over the file, the first and the last included."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for i in range(SAMPLES):
            f.seek(max(0, (size - BLOCK) * i // (SAMPLES - 1)))
            h.update(f.read(BLOCK))
    return h.hexdigest()


def _stamp(folder: Path, files: list[Path]) -> list:
    out = []
    for f in files:
        st = f.stat()
        out.append([str(f.relative_to(folder)), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns])
    return out


def write_manifest(folder: Path, source_digest: str) -> str:
    """Describe ``folder`` (a finished entry, before it is renamed into place); return its digest."""
    files, whole = {}, hashlib.sha256()
    for f in _files(folder):
        rel, size = str(f.relative_to(folder)), f.stat().st_size
        digest = _sha256(f)
        files[rel] = {"size": size, "sha256": digest, **({"sampled": _sampled(f, size)} if size > SMALL else {})}
        whole.update(f"{rel}\0{digest}\n".encode())
    digest = "sha256:" + whole.hexdigest()
    (folder / MANIFEST).write_text(json.dumps({"source": source_digest, "digest": digest, "files": files}, indent=1))
    _mark_verified(folder)
    return digest


def _mark_verified(folder: Path) -> None:
    try:
        (folder / VERIFIED).write_text(json.dumps(_stamp(folder, _files(folder))))
    except OSError:  # a read-only cache: the next use checks fully again, nothing worse
        pass


def problem(folder: Path, source_digest: str) -> str | None:
    """Why the entry at ``folder`` cannot be used (naming the file), or None when it is sound."""
    if not (folder / MANIFEST).exists():
        return f"{folder} has no {MANIFEST} (left unfinished, or made by an older taskrun)"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        listed = manifest["files"]
        if manifest.get("source") != source_digest:
            return f"{folder / MANIFEST} was made from another source"
        files = _files(folder)
        found = {str(f.relative_to(folder)): f for f in files}
        for rel, want in listed.items():
            f = found.get(rel)
            if f is None:
                return f"{folder / rel} is missing"
            size = f.stat().st_size
            if size != want["size"]:
                return f"{f} has {size:,} bytes, not {want['size']:,}"
            if size <= SMALL and _sha256(f) != want["sha256"]:
                return f"{f} does not match its digest"
            if size > SMALL and _sampled(f, size) != want.get("sampled"):
                return f"{f} does not match its digest"
        if set(found) - set(listed):
            return f"{folder} holds files its manifest does not list"
        if _verified_stamp(folder) != _stamp(folder, files):  # changed since the last full check
            for rel, want in listed.items():
                if found[rel].stat().st_size > SMALL and _sha256(found[rel]) != want["sha256"]:
                    return f"{found[rel]} does not match its digest"
            _mark_verified(folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{folder / MANIFEST} cannot be read ({type(exc).__name__})"
    return None


def _verified_stamp(folder: Path):
    try:
        return json.loads((folder / VERIFIED).read_text())
    except (OSError, ValueError):
        return None


def digest_of(folder: Path) -> str | None:
    """The digest of a verified entry's files (what ran), from its manifest."""
    try:
        return json.loads((folder / MANIFEST).read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


def warn_rebuilt(why: str) -> None:
    """The one line a damaged entry costs the user."""
    print(
        f"warning: {why}; it is taskrun's own cache of a converted model, so it was removed and is being rebuilt",
        file=sys.stderr,
        flush=True,
    )


def temp_folder(target: Path) -> Path:
    """A new temporary folder beside ``target``, named so that :func:`clean_stale` can tell whose."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-{os.getpid()}-"))


def clean_stale(parent: Path, max_age_s: float = STALE_S) -> list[Path]:
    """Remove the temporary folders left in ``parent`` by conversions that did not finish: their
    process is gone, or they are older than ``max_age_s``. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    now = time.time()
    for d in entries:
        # Hidden folders here are conversions in progress or left behind (older taskruns named
        # them without a pid: those go by age alone).
        if not (d.name.startswith(".") and d.is_dir()):
            continue
        pid = d.name.split(".tmp-", 1)[1].split("-", 1)[0] if ".tmp-" in d.name else None
        try:
            old = now - d.stat().st_mtime > max_age_s
        except OSError:
            continue
        if old or pid is not None and not _alive(pid):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _alive(pid: str) -> bool:
    """Whether process ``pid`` still runs here (a folder made by a live conversion is kept)."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


class CacheNotWritable(TaskError):
    """taskrun's cache folder could not take an entry (read-only, missing, full)."""


def build_or_temp(target: Path, card, what: str, build: Callable[[Path], None]) -> Path:
    """``build_once``, or, when taskrun's cache cannot take the entry, the same build in a temporary
    folder that is removed when the process exits: the job still runs (an unwritable cache is
    already said once per run), paying the build each time. For entries that are only a faster
    form of weights the job could run without (ONNX exports), never for what the user asked for."""
    import atexit

    try:
        return build_once(target, card, what, build)
    except CacheNotWritable:
        folder = Path(tempfile.mkdtemp(prefix="taskrun-build-"))
        atexit.register(shutil.rmtree, folder, True)
        build(folder)
        card.extra["ran"] = [f"ran a temporary copy of {what} (taskrun's cache is not writable)"]
        return folder


def build_once(target: Path, card, what: str, build: Callable[[Path], None]) -> Path:
    """The converted folder ``target`` for ``card`` (a ModelCard), built by ``build(folder)`` when it
    is missing or damaged: in a temp folder beside it, given a manifest, then renamed into place, so
    a crash never leaves half an entry and two processes converting at once each end with a sound
    one. ``what`` names the source in the run log's note ("the GGUF"). A cache that cannot be
    written is a CacheNotWritable (a TaskError) naming the fix. Returns ``target``;
    ``card.extra["ran"]`` says what ran."""

    clean_stale(target.parent)
    if target.exists():
        why = problem(target, card.digest)
        if why is None:
            return _ran(card, target, what)
        warn_rebuilt(why)
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp = temp_folder(target)
    except OSError as exc:
        raise CacheNotWritable(
            f"cannot convert {card.name}: taskrun's cache {target.parent} is not writable "
            f"({exc.strerror or exc}); set TASKRUN_CACHE_DIR to a writable folder"
        ) from None
    try:
        build(tmp)
        write_manifest(tmp, card.digest)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first: keep its folder if it is sound
            if problem(target, card.digest) is not None:
                raise
    except OSError as exc:
        raise CacheNotWritable(
            f"cannot convert {card.name} into taskrun's cache {target.parent} "
            f"({exc.strerror or exc}); free some space or set TASKRUN_CACHE_DIR"
        ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return _ran(card, target, what)


def _ran(card, folder: Path, what: str) -> Path:
    """Note on the card what actually runs: the converted folder and its digest (logged in notes)."""
    from taskrun.models.cache_record import note_written

    note_written(
        folder, folder.parent.parent
    )  # <cache>/<kind>/<entry>  # a sound entry of taskrun's: `run cache prune --all` may remove it
    card.extra["ran"] = [f"ran the converted copy {folder} ({digest_of(folder)}) of {what}"]
    return folder
