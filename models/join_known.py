"""Joined models from before taskrun recorded what it writes into its cache: recognised by the
sha256 models.toml pins for each join (models/join.py joins; this module reads models.toml, which
join.py does not, so that models/resolve.py can use the join without a cycle).
"""

from __future__ import annotations

from pathlib import Path

from taskrun.models.join import _beside, _holds_only


def known_joins() -> dict[str, tuple[str, str, frozenset[str]]]:
    """What taskrun joins into ``<cache>/joined/``: alias → (the joined file's name, the sha256
    models.toml pins for it, the names of the files the join puts beside it), for every entry that
    pins one. An entry without a pinned digest is not here: its join cannot be told from a user's."""
    from taskrun.models.resolve import aliases

    known = {}
    for name, entry in aliases().items():
        if entry.get("join") and entry.get("sha256"):
            pinned = "sha256:" + entry["sha256"].removeprefix("sha256:")
            known[name] = (entry.get("join_as", "model.bin"), pinned, _beside(entry))
    return known


def _is_join_lock(path: Path, alias: str) -> bool:
    """Is ``path`` the lock file joined() takes for ``alias`` (an empty file, of a join alias)?"""
    from taskrun.models.resolve import aliases

    if not aliases().get(alias, {}).get("join") or path.is_symlink():
        return False
    try:
        return path.is_file() and path.stat().st_size == 0
    except OSError:
        return False


def recognised(cache: Path, name: str) -> bool:
    """Is the cache entry ``name`` a join of taskrun's, byte for byte, though it is not in the
    record of what taskrun wrote (it was joined before that record existed)? Only ``joined/ALIAS``
    for an alias of :func:`known_joins`, a real folder holding nothing but what the join writes
    there, whose joined file hashes to the pinned sha256 (read once; then its stamp in
    digests.json answers). Anything else may be the user's."""
    folder, _, alias = name.partition("/")
    if folder != "joined":
        return False
    if alias.startswith(".") and alias.endswith(".lock"):  # the empty lock a join takes (joined())
        return _is_join_lock(cache / name, alias[1:-5])
    known = known_joins().get(alias)
    if known is None:
        return False
    file_name, pinned, beside = known
    path = cache / name
    target = path / file_name
    try:
        if target.is_symlink() or not target.is_file() or not _holds_only(path, {file_name} | beside):
            return False
        from taskrun.models.digest import digest_path

        return digest_path(target, cache) == pinned
    except OSError:
        return False
