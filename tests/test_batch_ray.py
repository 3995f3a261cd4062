"""`run batch --engine ray`: the same lines as the local engine, a private local cluster (nothing
listens beyond 127.0.0.1, nothing written under $HOME), and a killed worker that loses and
doubles nothing. One Ray session for the module: starting one takes seconds."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from taskrun.runner.batch import ray_keeper
from taskrun.runner.batch.run import Request, run_batch
from taskrun.runner.commands.batch import _workers
from tests.test_batch import read_jsonl, write_jsonl
from tests.tiny.bert import build as build_bert
from tests.tiny.whisper import SAMPLES, build_ct2, clip

pytest.importorskip("ray.data")  # imported before the cluster starts: start_local must still keep it private
HOME = Path.home()


def descendants(root: int) -> set[int]:
    """Every process below ``root``: Ray's GCS, raylet, agents and workers are started by the driver."""
    return set(ray_keeper.descendants(root))


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    return ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listening(pids: set[int]) -> set[str]:
    """'address:port' of the TCP sockets these processes listen on (from /proc: no psutil, no ss)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    out = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = row.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                addr, port = f[1].split(":")
                out.add(f"{_address(addr)}:{int(port, 16)}")
    return out


def is_loopback(listener: str) -> bool:
    addr = ipaddress.ip_address(listener.rsplit(":", 1)[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def ray_named_in_home() -> set[str]:
    """Anything named like Ray two levels under $HOME (~/.ray, ~/.cache/ray, ~/.config/ray...)."""
    found = set()
    for top in [HOME] + [p for p in HOME.iterdir() if p.is_dir() and not p.is_symlink()]:
        try:
            found |= {str(p) for p in top.iterdir() if "ray" in p.name.lower()}
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def ray_session():
    from taskrun.runner.batch.ray_engine import start_local, stop_local

    home_before = ray_named_in_home()
    temp = start_local(num_cpus=2)
    assert Path(temp).stat().st_mode & 0o077 == 0, "Ray's session folder is open to other users"
    yield
    stop_local(temp)
    assert not Path(temp).exists()
    assert ray_named_in_home() == home_before, "Ray wrote under $HOME"


def run(inputs, output, **kw):
    kw.setdefault("quiet", True)
    return run_batch(Request(inputs=tuple(map(str, inputs)), output=str(output), **kw), workers_of=_workers)


def test_ray_gives_the_local_lines_and_listens_on_loopback_only(ray_session, tiny_dir, tmp_path):
    bert = str(build_bert(tiny_dir))
    jobs = write_jsonl(
        tmp_path / "jobs.jsonl",
        [{"id": f"e{i}", "task": "embed", "input": f"the cat {i}", "model": bert} for i in range(12)]
        + [{"id": "bad", "task": "embed", "input": "x", "model": bert, "options": {"nope": 1}}],
    )
    local = run([jobs], tmp_path / "local.jsonl")
    seen: set[str] = set()
    stop = threading.Event()

    def sample() -> None:  # while the batch runs: GCS, raylet, agents and the actor are all up
        while not stop.is_set():
            seen.update(listening(descendants(os.getpid()) | {os.getpid()}))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        ray = run([jobs], tmp_path / "ray.jsonl", engine="ray", chunk=4)
    finally:
        stop.set()
        sampler.join()
    assert (local.ok, local.failed) == (ray.ok, ray.failed) == (12, 1)
    a = {x["id"]: x for x in read_jsonl(tmp_path / "local.jsonl")}
    b = {x["id"]: x for x in read_jsonl(tmp_path / "ray.jsonl")}
    assert a.keys() == b.keys() and all(a[k]["status"] == b[k]["status"] for k in a)
    for k in a:
        if a[k]["status"] == "ok":
            assert b[k]["result"]["vector"] == pytest.approx(a[k]["result"]["vector"], abs=1e-5)
    assert a["bad"]["error"] == b["bad"]["error"]
    assert seen, "found no listening socket of Ray's processes: the check saw nothing"
    assert {s for s in seen if not is_loopback(s)} == set(), f"Ray listened beyond loopback: {seen}"


def worker_pids() -> set[int]:
    """Ray Data's actor processes (Ray titles them ray::MapWorker(...))."""
    out = set()
    for pid in descendants(os.getpid()):
        try:
            if b"MapWorker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            continue
    return out


def test_killing_a_worker_mid_batch_loses_and_doubles_nothing(ray_session, tiny_dir, tmp_path):
    whisper = str(build_ct2(tiny_dir))
    rec = tmp_path / "rec"
    rec.mkdir()
    for i in range(8):
        shutil.copy(clip(tiny_dir), rec / f"c{i}.wav")
    out = tmp_path / "out.jsonl"
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.update(
            o=run(["transcribe", rec], out, engine="ray", model=whisper, options={"beam_size": 1, "language": "en"})
        )
    )
    worker.start()
    killed, deadline = None, time.monotonic() + 180
    while killed is None and worker.is_alive() and time.monotonic() < deadline:
        pids = worker_pids()
        if pids and out.exists() and out.read_bytes().count(b"\n") >= 1:
            killed = (pids.pop(), out.read_bytes().count(b"\n"))
            os.kill(killed[0], signal.SIGKILL)
        time.sleep(0.05)
    worker.join(300)
    assert killed is not None and killed[1] < 8, "the kill did not land mid-batch"
    lines = read_jsonl(out)
    assert sorted(x["id"] for x in lines) == [f"c{i}.wav" for i in range(8)]
    assert all(x["status"] == "ok" for x in lines) and result["o"].ok == 8


@pytest.mark.real
def test_real_transcripts_are_identical_on_both_engines_and_the_cli(ray_session, tmp_path):
    import json

    import soundfile as sf
    from click.testing import CliRunner

    from taskrun.runner.cli import main

    rec = tmp_path / "rec"
    rec.mkdir()
    audio, sr = sf.read(SAMPLES / "meeting.wav", dtype="int16")
    for i, (a, b) in enumerate([(9.3, 12.7), (20.0, 26.0)]):
        sf.write(rec / f"clip{i}.wav", audio[int(a * sr) : int(b * sr)], sr, subtype="PCM_16")
    local = run(["transcribe", rec], tmp_path / "local.jsonl", workers="1")
    ray = run(["transcribe", rec], tmp_path / "ray.jsonl", engine="ray")
    assert local.ok == ray.ok == 2
    a = {x["id"]: x["result"] for x in read_jsonl(tmp_path / "local.jsonl")}
    b = {x["id"]: x["result"] for x in read_jsonl(tmp_path / "ray.jsonl")}
    assert a == b and "young man" in a["clip0.wav"]["text"]
    cli = CliRunner().invoke(main, ["transcribe", str(rec / "clip0.wav"), "--json", "-q"])
    assert json.loads(cli.stdout.strip().splitlines()[-1])["items"][0]["result"] == a["clip0.wav"]
