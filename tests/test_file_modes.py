"""File modes: outputs get the user's umask (0644 under 022) as any other tool's output would;
the run log and the search index, which hold the user's texts, stay private (0600)."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.tasks.base import atomic_write
from tests.tiny.bert import build as tiny_bert


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set a umask for one test and restore the previous one after it."""
    old = os.umask(0o022)
    yield lambda m: os.umask(m)
    os.umask(old)


@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_write_follows_the_umask(mask, expected, umask, tmp_path):
    umask(mask)
    atomic_write(tmp_path / "a.txt", "hello")
    atomic_write(tmp_path / "b.bin", b"\x00\x01")
    assert mode(tmp_path / "a.txt") == expected and mode(tmp_path / "b.bin") == expected
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_replacing_a_file_keeps_its_mode_and_private_is_0600(umask, tmp_path):
    umask(0o022)
    target = tmp_path / "t.srt"
    target.write_text("old")
    os.chmod(target, 0o640)
    atomic_write(target, "new")
    assert target.read_text() == "new" and mode(target) == 0o640
    atomic_write(tmp_path / "cache.bin", b"x", private=True)
    assert mode(tmp_path / "cache.bin") == 0o600


def test_a_failed_write_leaves_nothing(umask, tmp_path):
    umask(0o022)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(TypeError):
        atomic_write(out / "x.txt", 12345)  # not str or bytes: fails inside the write
    assert list(out.iterdir()) == []


def test_cli_outputs_are_readable_by_others_and_the_run_log_is_private(umask, tmp_path, tiny_dir, monkeypatch):
    umask(0o022)
    log = tmp_path / "logs" / "runs.db"
    monkeypatch.setenv("TASKRUN_LOG_DB", str(log))
    model = tiny_bert(tiny_dir)
    for name in ("v.npy", "v.csv", "v.json"):
        r = CliRunner().invoke(main, ["embed", "the cat", "--model", str(model), "-o", str(tmp_path / name), "-q"])
        assert r.exit_code == 0, r.output
        assert mode(tmp_path / name) == 0o644, name
    assert mode(log) == 0o600
    for side in (log.with_name("runs.db-wal"), log.with_name("runs.db-shm")):
        if side.exists():
            assert mode(side) == 0o600


def test_onnxruntime_writes_nothing_into_home(tmp_path):
    """faster-whisper's VAD runs on onnxruntime, which by default keeps a device id and a telemetry
    database under ~/.cache/Microsoft; importing taskrun's pipelines turns that off."""
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    code = "import taskrun.pipelines\nfrom faster_whisper.vad import get_vad_model\nget_vad_model()\n"
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    subprocess.run([sys.executable, "-c", code], env={**env, "HOME": str(home)}, check=True, timeout=120)
    assert list(home.rglob("*")) == []
