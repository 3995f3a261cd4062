"""Issue 33 item 18 on the server: upload temp folders left by a server killed with -9 are swept
when a server starts; a client may not choose the runtime unless the operator allows it. Real
`run serve` subprocesses."""

from __future__ import annotations

import os
import time

from taskrun.runner.serve.sweep import sweep_uploads
from tests.serve_helpers import Server, models_toml, server_env


def test_a_server_sweeps_the_upload_folders_of_killed_ones(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**server_env(tmp_path, tmp_path / "cache", models_toml({}, tmp_path)), "TMPDIR": str(tmp)}
    first = Server(tmp_path, env)
    try:
        first.wait_healthy()
        left = tmp / f"taskrun-upload-{first.proc.pid}-x1"  # what its Uploads makes for a request
        left.mkdir()
        (left / "0001-clip.wav").write_bytes(b"RIFF" + b"\0" * 4096)
        first.proc.kill()  # -9: no cleanup runs
        first.proc.wait()
    finally:
        first.stop()
    mine = tmp / f"taskrun-upload-{os.getpid()}-x2"  # a live process's: kept
    mine.mkdir()
    assert left.exists()
    second = Server(tmp_path, env)
    try:
        second.wait_healthy()
        assert not left.exists() and mine.exists()
    finally:
        second.stop()


def test_folders_without_a_pid_go_once_an_hour_old(tmp_path):
    old, new = tmp_path / "taskrun-upload-abc", tmp_path / "taskrun-upload-def"
    for p in (old, new):
        p.mkdir()
    hour_ago = time.time() - 3700
    os.utime(old, (hour_ago, hour_ago))
    assert sweep_uploads(tmp_path) == [old]
    assert new.exists() and not old.exists()


def test_a_client_may_not_choose_the_runtime_unless_the_operator_allows_it(tmp_path, tiny_dir):
    """Item 18: `"runtime": "onnxruntime"` made the server export and load a second copy of the
    model; runtimes are the operator's (`--client-runtimes` lets clients choose)."""
    import httpx

    from tests.tiny import bert

    toml = models_toml({"tiny-bert": {"local": str(bert.build(tiny_dir))}}, tmp_path)
    env = server_env(tmp_path, tmp_path / "cache", toml)
    body = {"input": "the cat", "model": "tiny-bert", "runtime": "onnxruntime"}
    for args, refused in (((), True), (("--client-runtimes",), False)):
        server = Server(tmp_path, env, *args)
        try:
            server.wait_healthy()
            r = httpx.post(server.url + "/v1/tasks/embed", json=body, timeout=120)
            same = httpx.post(server.url + "/v1/tasks/embed", json={**body, "runtime": "transformers"}, timeout=120)
        finally:
            server.stop()
        assert same.status_code == 200, same.text  # naming the model's own runtime is fine
        if refused:
            assert r.status_code == 400 and "--client-runtimes" in r.text and "runtime" in r.text, r.text
        else:
            assert "--client-runtimes" not in r.text, r.text


def test_a_running_server_sweeps_again_not_only_at_its_start(tmp_path):
    """Upload folders that a killed sibling leaves while this server runs go at the next sweep
    (TASKRUN_SWEEP_S), not only when a server starts; a live process's folder stays."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**server_env(tmp_path, tmp_path / "cache", models_toml({}, tmp_path)), "TMPDIR": str(tmp)}
    server = Server(tmp_path, {**env, "TASKRUN_SWEEP_S": "0.3"})
    try:
        server.wait_healthy()
        dead = _dead_pid()
        left = tmp / f"taskrun-upload-{dead}-x1"  # what a sibling killed with -9 leaves
        left.mkdir()
        (left / "0001-clip.wav").write_bytes(b"RIFF" + b"\0" * 4096)
        mine = tmp / f"taskrun-upload-{os.getpid()}-x2"
        mine.mkdir()
        deadline = time.monotonic() + 20
        while left.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left.exists() and mine.exists()
    finally:
        server.stop()


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid
