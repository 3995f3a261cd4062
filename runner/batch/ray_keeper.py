"""The keeper of a private local Ray cluster: the process that starts it, and the one that ends it,
whatever becomes of the `run batch` that asked for it.

Started by the driver (``ray_engine.start_local``) as ``python -m taskrun.runner.batch.ray_keeper
TEMP CPUS``. It makes itself a child subreaper (Linux), starts the cluster with ``ray.init`` (its
GCS, raylet, agents and workers are then all below it, and an agent or worker orphaned by the
raylet's end is handed to it, not to init), prints the cluster's address and reads its stdin,
a pipe from the driver, until the pipe closes: the driver closes it when done, and the kernel
closes it when the driver dies, even by SIGKILL. Then it ends every process below it (SIGTERM,
then SIGKILL after a grace period), reaps them, removes the session folder TEMP and exits.

Why a keeper and not Ray's own clean-up: Ray kills its GCS and raylet with the driver
(PR_SET_PDEATHSIG), but the raylet's dashboard and runtime-env agents outlive them (measured,
Ray 2.60: both alive, one listening, after a kill -9 of the driver), and the session folder is
only ever removed by the driver itself.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

GRACE_S = 2.0  # SIGTERM → SIGKILL: the raylet and GCS end within a second on SIGTERM
PR_SET_CHILD_SUBREAPER = 36
OWNER = "owner"  # in the session folder: "PID START" of the driver and of the keeper, one a line


def start_ticks(pid: int) -> str | None:
    """The process's start time (clock ticks since boot; /proc/PID/stat field 22): with the pid
    it names one process, never a later one given the same pid. None when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """Every process below ``root``, read from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(0), []):
            out.append(c)
            todo.append(c)
    return out


def _reap() -> None:
    """Collect the exit status of every ended child: as a subreaper this process is the parent
    of the orphans too, and a zombie is still a process until its parent reaps it."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_all(grace_s: float = GRACE_S) -> None:
    """SIGTERM every process below this one, SIGKILL what is left after ``grace_s``, reap all."""
    me = os.getpid()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in descendants(me):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap()
            if not descendants(me):
                return
            time.sleep(0.05)


def _subreaper() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _quiet() -> None:
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)


def _stop(signum, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> None:
    temp, cpus = argv
    code = 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the driver decides
    signal.signal(signal.SIGTERM, _stop)
    _subreaper()
    try:
        import ray

        ray.init(
            num_cpus=int(cpus),
            include_dashboard=False,
            _temp_dir=temp,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            logging_level="WARNING",
            configure_logging=True,
        )
        signal.signal(signal.SIGTERM, _stop)  # ray.init installs its own (and Ray's C++ one)
        os.chmod(temp, 0o700)  # Ray opens its temp folder to everyone (0777); its sockets are in it
        sys.stdout.write(ray.get_runtime_context().gcs_address + "\n")
        sys.stdout.flush()
        sys.stdin.buffer.read()  # until the driver closes the pipe or dies
    except BaseException:
        traceback.print_exc()  # the driver says the cluster did not start; this says why
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _quiet()  # Ray's threads here log the GCS's end as errors ("Broken pipe"): not news
        end_all()
        shutil.rmtree(temp, ignore_errors=True)
        sys.stdout.flush()
        os._exit(code)  # not Ray's atexit hooks: they would wait on the GCS just ended


if __name__ == "__main__":
    main(sys.argv[1:])
