"""The Ray engine: the same batch as a Ray Data pipeline, on a cluster or on a private local one.

    staged items (JSONL) → read_json → map_batches(BatchActor, ActorPoolStrategy(size=N))
                         → iter_rows on the driver → the same resumable output (journal.py)

The driver reads and checks the input, skips the ids already done, and stages the rest as one
JSONL beside the output (the output's folder must be one every node can read on a multi-node
cluster, as the inputs' paths must be). Each actor loads its model once and runs
``work.run_window`` on its batches, exactly as the local engine does; it returns the lines and
the run-log rows, and the driver alone writes both, so resume, torn-line handling and the run log
are the engine's, not Ray's. A killed worker is restarted by Ray and its batch run again
(``max_restarts``, ``max_task_retries``); a batch's output reaches the driver only once it is
complete, and the driver also skips any id it has already written, so nothing is lost or doubled.

A local cluster started here stays private: 127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
makes Ray 2.60 pick the loopback address as the node's address, where it otherwise picks the
machine's routable one; ``_node_ip_address`` says the same), no dashboard, no auth token written
under $HOME (``RAY_AUTH_MODE=disabled``; the cluster is reachable from this machine only), no usage
statistics sent, and its session files in a temporary folder under $TMPDIR only this user can
open (Ray makes it 0777; set back to 0700). It runs under a keeper process (``ray_keeper.py``) that
ends every process of the cluster and removes that folder when the driver ends, however it ends
(kill -9 included); a folder whose driver and keeper are both gone is swept by the next start.
``ray.init`` replaces the SIGTERM handler; taskrun's is put back, so SIGTERM still exits 143.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from taskrun.runner.batch.source import Entry
from taskrun.runner.batch.work import Context, Finished
from taskrun.tasks.base import TaskError

PRIVATE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# What the actors need from the driver's environment to resolve models and stay offline.
FORWARD_ENV = (
    "TASKRUN_MODELS_TOML",
    "TASKRUN_CACHE_DIR",
    "TASKRUN_DEBUG",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "TOKENIZERS_PARALLELISM",
)
# The longest socket path Ray makes in its session folder, and the most a Unix socket's may take.
SOCKET_TAIL = "/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
SOCKET_MAX = 107
_KEEPERS: dict[str, subprocess.Popen] = {}  # session folder → its keeper (ray_keeper.py)
MAX_TASK_RETRIES = 3  # a batch that kills its worker this many times in a row fails the run


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise TaskError("--engine ray needs Ray Data: pip install 'taskrun[ray]'") from None
    return ray


def start_local(num_cpus: int | None = None) -> str:
    """Start a private one-machine Ray cluster (see the module's docstring) under its keeper
    (``ray_keeper``) and connect to it; returns its session folder, for ``stop_local``."""
    for key, value in PRIVATE_ENV.items():
        os.environ[key] = value  # Ray's processes read these when they start
    ray = _import_ray()
    from ray._private import ray_constants

    # The driver reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when ray is first imported. Imported
    # earlier (by a caller, a test), it is on, and the cluster binds every interface (measured:
    # [::] and the machine's address) even with _node_ip_address set; so it is set here too.
    ray_constants.ENABLE_RAY_CLUSTER = False
    from taskrun.pipelines.device import cpu_threads

    sweep()
    temp = tempfile.mkdtemp(prefix="taskrun-ray-")  # under $TMPDIR: the run's, never $HOME
    if len(temp.encode()) + len(SOCKET_TAIL) > SOCKET_MAX:
        os.rmdir(temp)
        raise TaskError(
            f"$TMPDIR is too long a path for the Ray cluster's sockets ({tempfile.gettempdir()}: a Unix "
            f"socket's path takes at most {SOCKET_MAX} bytes); run with a shorter one, e.g. TMPDIR=/tmp"
        )
    keeper = subprocess.Popen(
        [sys.executable, "-m", "taskrun.runner.batch.ray_keeper", temp, str(num_cpus or cpu_threads())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=dict(os.environ, **PRIVATE_ENV),
    )
    _KEEPERS[temp] = keeper
    try:  # a failed start, or a Ctrl-C or SIGTERM during it, ends the keeper too
        _own(temp, keeper.pid)
        address = keeper.stdout.readline().decode().strip() if keeper.stdout else ""
        if not address:
            keeper.wait()
            raise TaskError(f"the local Ray cluster did not start (exit {keeper.returncode}; its errors are above)")
        with _own_sigterm():
            ray.init(address=address, _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="WARNING")
    except BaseException:
        stop_local(temp)
        raise
    _quiet_data()
    return temp


def stop_local(temp: str) -> None:
    """Disconnect, then have the keeper end the cluster and remove its folder (and wait for it)."""
    ray = _import_ray()
    ray.shutdown()
    keeper = _KEEPERS.pop(temp, None)
    if keeper is not None:
        if keeper.stdin:
            keeper.stdin.close()  # the keeper's signal: end the cluster
        try:
            keeper.wait(timeout=30)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()
    shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def _own_sigterm():
    """``ray.init`` replaces the SIGTERM handler twice (Python's: exit 15; its C++ one: a crash
    dump): taskrun's is put back, so a SIGTERM still ends the batch as Ctrl-C does, exit 143."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _own(temp: str, keeper: int) -> None:
    """Name the folder's owners (this driver and its keeper), for ``sweep``."""
    from taskrun.runner.batch.ray_keeper import OWNER, start_ticks

    text = "".join(f"{pid} {start_ticks(pid)}\n" for pid in (os.getpid(), keeper))
    Path(temp, OWNER).write_text(text)


def sweep(folder: str | None = None, min_age_s: float = 60.0) -> list[str]:
    """Remove the ``taskrun-ray-*`` session folders whose owners are all gone (a run killed with
    its keeper, as by ``kill -9`` of the process group); returns those removed. A folder without
    an owner file is removed once ``min_age_s`` old (it may be a run starting right now)."""
    from taskrun.runner.batch.ray_keeper import OWNER, start_ticks

    removed = []
    for d in Path(folder or tempfile.gettempdir()).glob("taskrun-ray-*"):
        try:
            if d.stat().st_uid != os.getuid():
                continue  # another user's run
            rows = [r.split() for r in (d / OWNER).read_text().splitlines() if r.strip()]
            stale = not any(start_ticks(int(pid)) == ticks for pid, ticks in rows)
        except FileNotFoundError:
            stale = _age(d) > min_age_s
        except (OSError, ValueError):
            continue  # another user's folder (0700), or not ours to judge
        if stale:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed


def _age(d: Path) -> float:
    return time.time() - d.stat().st_mtime


def _quiet_data() -> None:
    """Ray Data's own bars and per-stage logs would interleave with taskrun's progress."""
    import logging

    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)


def actor_class(ctx: Context, threads: int) -> type:
    """The actor class for one batch, its context built in: Ray restarts a killed actor from its
    class alone (constructor arguments would live in the object store, which Ray warns may be
    gone by the time of a restart)."""
    settings = asdict(ctx)

    class BatchActor:
        """One Ray actor: its models load on its first batch and stay loaded (the pipelines'
        cache) for every later one."""

        def __init__(self) -> None:
            os.environ["TASKRUN_THREADS"] = str(threads)  # before torch starts its pool here
            self.ctx = Context(**settings)

        def __call__(self, batch: dict) -> dict:
            from taskrun.runner.batch.local import pool_window

            entries = [Entry(*json.loads(str(row))) for row in batch["row"]]
            finished, rows = pool_window(entries, self.ctx)
            return {
                "lines": [json.dumps(f.lines, ensure_ascii=False) for f in finished],
                "task": [f.task or "" for f in finished],
                "wall_s": [float(f.wall_s) for f in finished],
                # the run-log rows ride with the first job's lines
                "rows": [json.dumps(rows, default=str) if k == 0 else "[]" for k in range(len(finished))],
            }

    return BatchActor


def stage(entries: Iterable[Entry], folder: Path, batch_id: str, *, by_length: bool) -> tuple[Path, int]:
    """The items to run, in a file read by Ray Data; (path, count). Each row is one string
    column holding the item as JSON: Ray's JSONL reader (pandas) infers column types, and an id
    such as "0012" or "1e5" must stay the string it is. ``by_length``: each window of items is
    written shortest first, so that a Ray batch (a job) holds texts of like length, as the local
    engine's windows do."""
    from taskrun.runner.batch.local import WINDOW, windows

    path = folder / f".taskrun-batch-{batch_id}.pending.jsonl"
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for win in windows(entries, WINDOW):
            rows = [json.dumps([e.n, e.id, e.flavour, e.line], ensure_ascii=False) for e in win]
            for row in sorted(rows, key=len) if by_length else rows:
                f.write(json.dumps({"row": row}, ensure_ascii=False) + "\n")
            n += len(rows)
    return path, n


def run_ray(
    entries: Iterable[Entry],
    ctx: Context,
    write,
    *,
    log,
    address: str | None,
    actors: int,
    output: str,
    batch_size: int,
) -> None:
    """Run the entries on Ray; ``write(finished)`` gets each finished job's lines, once per id."""
    temp = None
    ray = _import_ray()
    if not ray.is_initialized():
        if address:
            with _own_sigterm():
                ray.init(address=address, log_to_driver=False, logging_level="WARNING")
            _quiet_data()
        else:
            temp = start_local()
    staged = None
    try:
        staged, n = stage(entries, Path(output).resolve().parent, ctx.batch_id, by_length=batch_size > 1)
        if n:  # batches no bigger than an even share: every actor gets work
            _pipeline(ray, staged, ctx, write, log, actors, min(batch_size, -(-n // actors)))
    finally:
        if staged is not None:
            staged.unlink(missing_ok=True)
        if temp is not None:
            stop_local(temp)


def _pipeline(ray, staged: Path, ctx: Context, write, log, actors: int, batch_size: int) -> None:
    from ray.data import ActorPoolStrategy

    per_actor = actor_cpus(ray, actors)
    env = {k: os.environ[k] for k in FORWARD_ENV if k in os.environ}
    # Reading the staged rows is light: it must not wait for a CPU the actors hold.
    ds = ray.data.read_json(str(staged), lines=True, num_cpus=0)
    ds = ds.map_batches(
        actor_class(ctx, per_actor),
        batch_size=batch_size,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=actors),
        num_cpus=per_actor,
        max_restarts=-1,
        max_task_retries=MAX_TASK_RETRIES,
        runtime_env={"env_vars": env},
    )
    written: set[str] = set()
    for row in ds.iter_rows():
        for r in json.loads(row["rows"]):
            if log is not None:
                log.append(r)
        lines = [x for x in json.loads(row["lines"]) if _key(x) not in written]
        written.update(_key(x) for x in lines)
        if lines:
            write(Finished(lines, row["task"] or None, float(row["wall_s"])))


def _key(line: dict) -> str:
    return line.get("custom_id") or line["id"]


def actor_cpus(ray, actors: int) -> int:
    """CPUs (and torch threads) per actor: the cluster's CPUs shared evenly by the actors, at
    most one node's worth (an actor runs on one node)."""
    nodes = [n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
    total, biggest = sum(nodes), max(nodes, default=1)
    return max(1, int(min(total // actors, biggest)))
