"""Which models this server runs: the aliases of models.toml that are installed here (what
`run models` lists as available), plus the models the operator preloaded by path.

A request names a model by one of these names, never by a path or a hub id: a client must not
make the server read or download whatever it names. The listing (digests included) is made
once, at start-up, in a thread.
"""

from __future__ import annotations

import os
import threading

from taskrun.tasks.base import TaskError
from taskrun.tasks.wire.errors import APIError


class Catalogue:
    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        self.preload = preload
        self._rows: list[dict] | None = None
        self._cards: dict = {}  # name -> (ModelCard, _stat of its path when resolved)
        self._lock = threading.Lock()  # the listing (it may hash every model once)
        self._cards_lock = threading.Lock()  # one card at a time, not held while listing

    def rows(self) -> list[dict]:
        """Every model available here: name, tasks, digest, runtime, size, path (blocking)."""
        with self._lock:
            if self._rows is None:
                self._rows = self._list()
            return self._rows

    def _list(self) -> list[dict]:
        from taskrun.models.provenance import describe
        from taskrun.models.resolve import list_models, resolve

        rows = [r for r in list_models(offline=True) if r["available"]]
        names = {r["name"] for r in rows}
        for name in self.preload:
            if name not in names:
                card = resolve(name, offline=True)
                rows.append(
                    {
                        "name": name,
                        "available": True,
                        "path": card.path,
                        "size_bytes": card.size_bytes,
                        "digest": card.digest,
                        "runtime": card.runtime,
                        "runtimes": list(card.runtimes),
                        "tasks": list(card.tasks),
                        "architecture": card.architecture,
                        "source": card.source,
                        "format": card.format,
                        "description": "",
                        **describe({}, card.path),  # parameters, quantisation from a GGUF's header
                    }
                )
        for r in rows:
            try:
                r["created"] = int(os.path.getmtime(r["path"]))
            except OSError:
                r["created"] = 0
        return rows

    def card(self, name: str):
        """The ModelCard of a model served here, resolved once (its digest read once)."""
        from taskrun.models.resolve import aliases, resolve

        with self._cards_lock:
            known = self._cards.get(name)
            if known is not None and known[1] == _stat(known[0].path):
                return known[0]
            if known is None and name not in aliases() and name not in self.preload:
                raise APIError(
                    404,
                    f"no model named '{name}' on this server; GET /v1/models lists them",
                    param="model",
                    code="model_not_found",
                )
            # new here, or its file changed on disk since (replaced, truncated by `cp`): resolved
            # again, so the job loads (or refuses) what the path holds now, never the old digest
            card = resolve(name, offline=True)
            self._cards[name] = (card, _stat(card.path))
            return card

    def model_for(self, task: str, model: str | None, first_kind: str | None) -> str:
        """The model a job runs on: the one named (it must be served here), else the task's
        default. 404 ``model_not_found`` for a model this server does not have (blocking: it
        may read the model's files once)."""
        from taskrun.models.resolve import default_model
        from taskrun.tasks.wire.errors import from_task_error

        try:
            name = model or default_model(task, first_kind)
            card = self.card(name)
        except TaskError as exc:
            raise from_task_error(exc) from None
        if task not in card.tasks:
            raise APIError(
                400,
                f"`{name}` serves {', '.join(card.tasks) or 'no task'}, not {task}; "
                f"GET /v1/models lists each model's tasks",
                param="model",
                code="model_task_mismatch",
            )
        return name


def _stat(path) -> tuple | None:
    """What changes when a model's file (or folder) is written: size, mtime, inode, ctime (~µs)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns
