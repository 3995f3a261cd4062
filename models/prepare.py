"""``python -m taskrun.models.prepare [ALIAS...]``: join the default models' split weights now.

``make install`` runs it after installing the weight packages, so that the first job after
install does not pay the join. The 1.5B default ships as one GGUF split over 22 packages. Joining
it (1.1 GB copied, its digest checked) made the first `run generate "Hi"` after install take
11.2 s wall against 4.7 s once joined (2-core Zen 3 host, 2026-12-07), over the 10 s the default
model's first job is allowed (issue 32).

Without aliases: every default of configs/models.toml's ``[defaults]`` that has a ``join``. It
writes into taskrun's cache folder (``TASKRUN_CACHE_DIR``, else the user cache folder:
``~/.cache/taskrun`` on Linux), where the first use would write it anyway. ``run cache list``
shows the entries and ``run cache prune`` removes them (the next use joins again). A model whose
packages are not installed is skipped. A damaged part is refused naming the package to reinstall,
and the exit status is then 1.
"""

from __future__ import annotations

import sys

from taskrun.models.provenance import packages
from taskrun.models.resolve import _joined, aliases, load_config
from taskrun.tasks.base import TaskError


def joined_defaults() -> list[str]:
    """The default models (``[defaults]``) shipped as split weights, each once, in table order."""
    known = aliases()
    out: list[str] = []
    for name in load_config().get("defaults", {}).values():
        if known.get(name, {}).get("join") and name not in out:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv) or joined_defaults()
    known, failed = aliases(), 0
    for name in names:
        entry = known.get(name)
        if entry is None or not entry.get("join"):
            print(f"{name}: not a model of split weights in configs/models.toml; nothing to join", file=sys.stderr)
            failed += 1
            continue
        try:
            path = _joined(entry, name)  # joined once; a second run finds it intact
        except TaskError as exc:  # a missing or damaged part: the message names the package to reinstall
            print(f"{name}: {exc}", file=sys.stderr)
            failed += 1
            continue
        if path is None:
            print(f"{name}: not joined: its weight packages are not installed ({packages(entry.get('pip', ''))})")
            continue
        size = sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size
        print(f"{name}: {path} ({size / 1e6:.0f} MB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
