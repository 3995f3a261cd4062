"""`run cache list | size | prune`: what taskrun keeps in its cache folder, and clearing it.

Everything there is rebuilt on use when missing, so any entry may go: the cost is the time to
rebuild it (a conversion, a re-embedding, a re-hash). The folder is ``models.resolve.cache_dir()``
(TASKRUN_CACHE_DIR, else the platform's user cache folder). The run log is not a cache and lives
elsewhere (`run logs`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import asdict, dataclass
from fnmatch import fnmatch
from pathlib import Path

import click

# What taskrun writes there: (pattern under the cache folder, kind, what it is). One entry per match.
KINDS = [
    ("gguf/*", "gguf", "a GGUF model converted for the transformers runtime"),  # pipelines/llm/gguf_convert.py
    ("converted/*", "ct2", "a CTranslate2 Whisper model converted to transformers"),  # pipelines/speech/ct2_convert.py
    ("onnx-vision/*", "onnx", "an image classifier exported to ONNX for ONNX Runtime"),  # vision/efficientnet_ort.py
    ("onnx-text/*", "onnx", "a text encoder exported to ONNX for ONNX Runtime"),  # pipelines/text/onnx_export.py
    (
        "llamacpp/*",
        "llamacpp",
        "a float16 copy of a small GGUF that llama.cpp reads prompts with",
    ),  # llamacpp_native.py
    ("joined/.*.lock", "joined", "the lock taken while a model is joined"),  # models/join.py
    ("joined/*", "joined", "a model joined from its split weight packages"),  # models/join.py
    ("search-index.sqlite*", "search", "search: corpus chunks and their vectors"),  # pipelines/text/search.py
    ("digests.json", "digests", "sha256 digests of model files"),  # models/digest.py
    ("digests.*.tmp", "digests", "a digest index being written"),
]
FOLDERS = {p.split("/")[0] for p, _, _ in KINDS if "/" in p}


@dataclass
class Entry:
    name: str  # its path under the cache folder: what `prune ENTRY` takes
    kind: str  # gguf | ct2 | joined | search | digests | other
    what: str
    bytes: int
    modified: float  # the newest file's mtime (seconds since the epoch)
    path: str


def cache_root() -> Path:
    from taskrun.models.resolve import cache_dir

    return cache_dir()


def entries(root: Path) -> list[Entry]:
    """Every entry of the cache folder, known kinds first; anything else as "other"."""
    from taskrun.models.cache_record import RECORD

    found: list[Entry] = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if p.name.startswith(RECORD):
            continue
        if p.name in FOLDERS and p.is_dir():
            found += [_entry(root, q) for q in sorted(p.iterdir())]
        else:
            found.append(_entry(root, p))
    ours = _written(root)
    for e in found:  # a name taskrun uses is not enough: only what it recorded writing is its own
        if e.kind != "other" and e.name not in ours and ".tmp" not in e.name and not _adopted(root, e):
            e.kind, e.what = "other", "not recorded as written by taskrun (.taskrun-written): removed only when named"
    sources = _sources(root)
    for e in found:  # converted entries are named by their source's digest: name the source
        key = re.search(r"[0-9a-f]{16,}", e.name)
        src = next((path for digest, path in sources.items() if key and key.group() in digest), None)
        if src and e.kind != "other":
            e.what += f" (from {src})"
    return found


def _adopted(root: Path, e: Entry) -> bool:
    """A joined model from before taskrun recorded what it writes, recognised by its pinned
    sha256 (models/join_known.py ``recognised``): recorded now, so prune may remove it like any other."""
    from taskrun.models.cache_record import note_written
    from taskrun.models.join_known import recognised

    if e.kind != "joined" or not recognised(root, e.name):
        return False
    note_written(Path(e.path), root)
    return True


def _written(root: Path) -> set[str]:
    """The entries taskrun recorded writing; a search index's -wal/-shm files go with it."""
    from taskrun.models.cache_record import written

    ours = written(root)
    return ours | {f"{n}{tail}" for n in ours for tail in ("-wal", "-shm", "-journal")}


def _entry(root: Path, p: Path) -> Entry:
    name = p.relative_to(root).as_posix()
    kind, what = next(
        ((k, w) for pat, k, w in KINDS if fnmatch(name, pat)), ("other", "not written by this version of taskrun")
    )
    if ".tmp-" in p.name:
        what = "an unfinished conversion left by a stopped run"
    size, newest = _measure(p)
    return Entry(name, kind, what, size, newest, str(p))


def _measure(p: Path) -> tuple[int, float]:
    """(bytes, newest mtime) of a file or a folder's files."""
    files = [p] if not p.is_dir() else [f for f in p.rglob("*") if f.is_file() and not f.is_symlink()]
    size, newest = 0, p.lstat().st_mtime
    for f in files:
        try:
            st = f.lstat()
        except OSError:
            continue
        size, newest = size + st.st_size, max(newest, st.st_mtime)
    return size, newest


def _sources(root: Path) -> dict[str, str]:
    """Model digest → the path it was read from, from the digest index."""
    try:
        known = json.loads((root / "digests.json").read_text())
        return {v["digest"]: path for path, v in known.items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def age(t: float) -> str:
    s = max(0.0, time.time() - t)
    return f"{s / 86400:.1f} d" if s >= 86400 else f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


@click.group("cache")
def cache_cmd():
    """What taskrun keeps in its cache folder (converted models, search indexes, digests), and
    clearing it. Every entry is rebuilt on use when missing: pruning costs only that time."""


@cache_cmd.command("list")
@click.option("--json", "json_mode", is_flag=True, help="One JSON object on stdout.")
def list_cmd(json_mode):
    """Every cache entry: its name (for `prune`), size, age and what it is."""
    root = cache_root()
    found = entries(root)
    if json_mode:
        click.echo(json.dumps({"dir": str(root), "entries": [asdict(e) for e in found]}))
        return
    width = max((len(e.name) for e in found), default=5)
    for e in found:
        click.echo(f"{e.name:<{width}}  {human(e.bytes):>9}  {age(e.modified):>8}  {e.what}")
    click.echo(f"{len(found)} entries, {human(sum(e.bytes for e in found))} in {root}", err=True)


@cache_cmd.command("size")
@click.option("--json", "json_mode", is_flag=True, help="One JSON object on stdout.")
def size_cmd(json_mode):
    """The cache folder's total size, and by kind."""
    root = cache_root()
    found = entries(root)
    by_kind: dict[str, int] = {}
    for e in found:
        by_kind[e.kind] = by_kind.get(e.kind, 0) + e.bytes
    total = sum(by_kind.values())
    if json_mode:
        click.echo(json.dumps({"dir": str(root), "bytes": total, "entries": len(found), "by_kind": by_kind}))
        return
    click.echo(f"{human(total)}  {root}  ({len(found)} entries)")
    for kind, n in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        click.echo(f"  {kind:<8} {human(n):>9}")


@cache_cmd.command("prune")
@click.argument("names", nargs=-1, metavar="[ENTRY]...")
@click.option("--all", "everything", is_flag=True, help="Remove every entry taskrun wrote.")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    metavar="DAYS",
    help="Remove entries taskrun wrote that were not written for DAYS days.",
)
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--json", "json_mode", is_flag=True, help="One JSON object on stdout.")
def prune_cmd(names, everything, older_than, dry_run, json_mode):
    """Remove cache entries: named ones (as `run cache list` shows them), --all, or --older-than DAYS.
    Files taskrun did not write ("other") go only when named. A job running meanwhile may need to
    rebuild what it was using."""
    if not (names or everything or older_than is not None):
        raise click.UsageError("say what to prune: ENTRY names from `run cache list`, --all, or --older-than DAYS")
    found = entries(cache_root())
    by_name = {e.name: e for e in found}
    unknown = [n for n in names if n.rstrip("/") not in by_name]
    if unknown:
        raise click.UsageError(f"no cache entry {', '.join(unknown)}; `run cache list` shows the names")
    cutoff = time.time() - older_than * 86400 if older_than is not None else None
    named = {n.rstrip("/") for n in names}
    chosen = [
        e
        for e in found
        if e.name in named or e.kind != "other" and (everything or cutoff is not None and e.modified < cutoff)
    ]
    # What --all or --older-than leaves because taskrun did not write it: said, so it is no surprise.
    left = [e for e in found if e.kind == "other" and e.name not in named] if everything or cutoff else []
    removed, failed = [], []
    for e in chosen:
        try:
            if not dry_run:
                _remove(Path(e.path))
            removed.append(e)
        except OSError as exc:
            failed.append(f"{e.name}: {exc.strerror or exc}")
    if not dry_run and removed:
        from taskrun.models.cache_record import forget

        forget(cache_root(), {e.name for e in removed})
    _report(removed, left, failed, dry_run, json_mode)
    if failed:
        raise click.ClickException(f"{len(failed)} entries could not be removed: {'; '.join(failed)}")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()
    parent = p.parent  # an emptied gguf/ or converted/ folder goes too
    if parent.name in FOLDERS and not any(parent.iterdir()):
        parent.rmdir()


def _report(removed: list[Entry], left: list[Entry], failed: list[str], dry_run: bool, json_mode: bool) -> None:
    freed = sum(e.bytes for e in removed)
    if json_mode:
        body = {"removed": [e.name for e in removed], "freed_bytes": freed, "dry_run": dry_run, "failed": failed}
        click.echo(json.dumps({**body, "left": [e.name for e in left]}))
        return
    verb = "would remove" if dry_run else "removed"
    for e in removed:
        click.echo(f"{verb} {e.name}  ({human(e.bytes)})")
    for e in left:
        click.echo(
            f"left {e.name}  ({human(e.bytes)}): taskrun did not record writing it; name it to remove it", err=True
        )
    click.echo(f"{verb} {len(removed)} entries, {human(freed)}", err=True)
