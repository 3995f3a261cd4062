"""Issue 33 item 18: upload temp folders left by a server killed with -9 are swept when a server
starts; those of live processes are kept. Real `run serve` subprocesses."""

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
