"""`run batch --engine ray` cleans up after itself: a SIGTERM to the driver ends it as every command
ends (exit 143, "interrupted by SIGTERM"), a SIGKILL leaves no Ray process behind either, the
session folder is removed (and a dead run's is swept on the next start), the output keeps only
whole lines, and a rerun finishes the rest with each id once. Every Ray start costs seconds, so
the whole story is one test over three runs of the real command."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from taskrun.runner.batch.ray_engine import sweep
from taskrun.runner.batch.ray_keeper import OWNER, start_ticks
from tests.test_batch import RUN, write_jsonl
from tests.tiny.bert import build as build_bert

psutil = pytest.importorskip("psutil")
pytest.importorskip("ray.data")
N = 600  # enough that the signal lands mid-run even when a loaded machine makes the watcher slow


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_sweep_removes_only_folders_whose_owners_are_gone(tmp_path):
    dead, alive, fresh = (tmp_path / f"taskrun-ray-{k}" for k in ("dead", "alive", "fresh"))
    for d in (dead, alive, fresh):
        d.mkdir()
    (dead / OWNER).write_text(f"{_dead_pid()} 1\n")
    (alive / OWNER).write_text(f"{_dead_pid()} 1\n{os.getpid()} {start_ticks(os.getpid())}\n")
    # the same pid started at another time is another process: its folder is stale
    (fresh / OWNER).write_text(f"{os.getpid()} 1\n")
    assert sorted(sweep(str(tmp_path))) == [str(dead), str(fresh)]
    assert not dead.exists() and alive.exists() and not fresh.exists()
    unowned = tmp_path / "taskrun-ray-starting"
    unowned.mkdir()
    assert sweep(str(tmp_path)) == [] and unowned.exists()  # a run starting now: not yet named
    assert sweep(str(tmp_path), min_age_s=-1) == [str(unowned)]


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def _run_until(cmd, env, out: Path, lines: int, sig: int):
    """Start the command, watch its processes and their listening sockets, send ``sig`` once the
    output has ``lines`` lines → (exit code, stderr, {pid: start time} seen, listening addresses)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict[int, float] = {}
    listens: set[str] = set()
    deadline, sockets_at = time.monotonic() + 240, 0.0
    while proc.poll() is None and time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= lines:
            break
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            continue
        read_sockets = time.monotonic() > sockets_at  # reading sockets is slow: once a second
        if read_sockets:
            sockets_at = time.monotonic() + 1
        for c in children:
            try:
                seen.setdefault(c.pid, c.create_time())
                if read_sockets:
                    listens |= {x.laddr.ip for x in c.net_connections(kind="inet") if x.status == "LISTEN"}
            except psutil.Error:
                continue
        time.sleep(0.05)
    assert proc.poll() is None, f"the batch ended before the signal: {proc.stderr.read()}"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, seen, listens


def _left(seen: dict[int, float], within_s: float = 10.0) -> list[str]:
    """The processes seen under the driver still alive ``within_s`` after it ended."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for pid, created in seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid} {p.name()}")
            except psutil.Error:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _whole_lines(out: Path) -> int:
    data = out.read_bytes()
    assert data.endswith(b"\n"), "the output ends in a torn line"
    assert all(json.loads(x)["status"] == "ok" for x in data.splitlines())
    return data.count(b"\n")


@pytest.fixture
def short_tmp():
    path = Path(tempfile.mkdtemp(prefix="tr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sigterm_and_kill_9_of_the_driver_leave_nothing_behind_and_a_rerun_finishes(tiny_dir, tmp_path, short_tmp):
    bert = str(build_bert(tiny_dir))
    rows = [{"id": f"s{i}", "task": "embed", "input": f"the cat {i}", "model": bert} for i in range(N)]
    jobs, out = write_jsonl(tmp_path / "jobs.jsonl", rows), tmp_path / "out.jsonl"
    tmp, home = short_tmp, tmp_path / "home"  # Ray's socket paths must fit 107 bytes: pytest's are long
    home.mkdir()
    stale = tmp / "taskrun-ray-stale"  # a run killed with its keeper: swept by the next start
    stale.mkdir()
    (stale / OWNER).write_text(f"{_dead_pid()} 1\n")
    env = dict(os.environ, TMPDIR=str(tmp), HOME=str(home), TASKRUN_THREADS="1")
    cmd = [RUN, "batch", str(jobs), "-o", str(out), "--engine", "ray", "--chunk", "2", "-q"]

    rc, err, seen, listens = _run_until(cmd, env, out, 4, signal.SIGTERM)
    assert rc == 143 and "interrupted by SIGTERM" in err, err
    assert "SIGTERM received" not in err  # Ray's crash dump
    assert len(seen) >= 5, f"saw too few of Ray's processes to judge: {seen}"
    assert listens and all(_loopback(a) for a in listens), f"Ray listened beyond 127.0.0.1: {listens}"
    assert _left(seen) == [], "Ray processes outlived the driver's SIGTERM"
    first = _whole_lines(out)
    assert 4 <= first < N

    rc, err, seen, _ = _run_until(cmd, env, out, first + 4, signal.SIGKILL)
    assert rc == -9
    assert _left(seen) == [], "Ray processes outlived the driver's kill -9"
    second = _whole_lines(out)
    # usually mid-run; where the warm actors write the last lines faster than the watcher polls,
    # the kill lands in the driver's shutdown instead, which must leave nothing behind either
    assert first < second <= N

    # the rest in bigger jobs: a resume need not use the killed run's --chunk
    again = subprocess.run([*cmd, "--chunk", "50"], capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr
    counts = Counter(json.loads(x)["id"] for x in out.read_bytes().splitlines())
    assert len(counts) == N and set(counts.values()) == {1}
    assert list(tmp.glob("taskrun-ray-*")) == [], "a Ray session folder stayed behind"
    assert not [p for p in home.rglob("*") if "ray" in p.name.lower()], "Ray wrote under $HOME"
