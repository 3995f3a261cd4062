"""The run log never blocks work, killed jobs leave a row, closed pipes end quietly.

Log faults: the job still runs and says once on stderr which file and why; `run logs` on a log it
cannot read is a one-line error naming the file and the fix. Signals and pipes run the CLI as a
real subprocess (a tiny random model), as `timeout`, `docker stop` or a shell would.

Where a fault needs root's permissions ignored (these tests may run as root), it is simulated
another way, said at each case: a read-only file as a `-wal` side file that cannot be made; a
read-only folder as a log path under a regular file; a full disk as a file size limit
(RLIMIT_FSIZE) in a child process with SIGXFSZ ignored, so writes fail with EFBIG.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog import liveness
from taskrun.runner.runlog.store import RunLog
from tests.tiny.bert import build as tiny_bert
from tests.tiny.generate import build as tiny_llama

ROOT = Path(__file__).resolve().parent.parent
ROOT_USER = os.geteuid() == 0
CLI = [sys.executable, "-c", "from taskrun.runner.cli import main; main()"]


def invoke(*args, input=None, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, env=env)


def good_log(path: Path, rows: int = 1) -> Path:
    log = RunLog(path)
    log.append({"id": "before", "started_at": "2026-01-01T00:00:00", "task": "embed", "status": "ok"})
    log.close()
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO runs (id, started_at, task, status, summary) VALUES (?, ?, 'embed', 'ok', ?)",
        [(f"r{i:05d}", f"2026-01-02T00:00:{i % 60:02d}", "x" * 80) for i in range(rows - 1)],
    )
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every row in the main file, as after a clean exit
    db.close()
    return path


# --------------------------------------------------------------------------- log faults


def damaged(tmp: Path) -> Path:
    p = tmp / "runs.db"
    p.write_bytes(os.urandom(8192))
    return p


def truncated(tmp: Path) -> Path:
    p = good_log(tmp / "runs.db", rows=400)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])  # the header still says the full size
    return p


def read_only_file(tmp: Path) -> Path:
    p = good_log(tmp / "runs.db")
    if ROOT_USER:  # root writes through 0400: make the WAL side file impossible to create instead
        (tmp / "runs.db-wal").mkdir()
    else:
        p.chmod(0o400)
    return p


def read_only_folder(tmp: Path) -> Path:
    if ROOT_USER:  # root writes into a 0500 folder: a log path under a regular file cannot be made
        (tmp / "logs").write_text("a file where the folder should be")
    else:
        (tmp / "logs").mkdir(mode=0o500)
    return tmp / "logs" / "runs.db"


LOG_FAULTS = {  # name: (make it, `run logs` still reads it)
    "damaged": (damaged, False),
    "truncated": (truncated, False),
    "read-only file": (read_only_file, False),
    "read-only folder": (read_only_folder, False),
}


@pytest.fixture
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


def assert_ran_with_one_warning(r, path: Path) -> None:
    assert r.exit_code == 0, r.output
    assert "(32-d)" in r.stdout  # the job's result
    warnings = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1, r.stderr
    assert warnings[0].startswith("warning: run log") and str(path) in warnings[0]
    assert "internal error" not in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("fault", sorted(LOG_FAULTS))
def test_a_log_that_cannot_be_used_never_blocks_the_job(fault, bert, tmp_path, monkeypatch):
    make, readable = LOG_FAULTS[fault]
    path = make(tmp_path)
    monkeypatch.setenv("TASKRUN_LOG_DB", str(path))
    r = invoke("embed", "the cat", "--model", bert, "-q")
    assert_ran_with_one_warning(r, path)
    assert "TASKRUN_LOG_DB" in r.stderr
    logs = invoke("logs")
    assert logs.exit_code == (0 if readable else 1), logs.output
    message = logs.stderr.strip().splitlines()
    assert len(message) == 1 and message[0].startswith(f"Error: cannot read the run log {path}"), logs.stderr
    assert "TASKRUN_LOG_DB" in message[0]
    if fault in ("damaged", "truncated"):
        assert f"mv {path} {path}.bad" in message[0]
    shown = invoke("logs", "show", "before")
    assert shown.exit_code == 1 and "cannot read the run log" in shown.stderr


def test_a_log_locked_longer_than_the_timeout_never_blocks_the_job(bert, tmp_path, monkeypatch):
    path = good_log(tmp_path / "runs.db")
    monkeypatch.setenv("TASKRUN_LOG_DB", str(path))
    monkeypatch.setenv("TASKRUN_LOG_TIMEOUT", "0.3")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of a long write
    try:
        t0 = time.perf_counter()
        r = invoke("embed", "the cat", "--model", bert, "-q")
        assert_ran_with_one_warning(r, path)
        assert "locked" in r.stderr
        assert time.perf_counter() - t0 < 60
        logs = invoke("logs", "--json")  # readers are not blocked by a writer (WAL)
        assert logs.exit_code == 0 and [row["id"] for row in json.loads(logs.stdout)] == ["before"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert invoke("embed", "the dog", "--model", bert, "-q").exit_code == 0
    assert RunLog(path).count() == 2  # logged again once the lock is gone


def test_a_long_lived_log_warns_once_and_logs_again_once_moved_aside(tmp_path, capsys):
    """A server keeps one RunLog: one warning however many jobs, and rows again once the user
    has followed the advice (`mv FILE FILE.bad`)."""
    path = damaged(tmp_path)
    log = RunLog(path)
    row = {"started_at": "2026-01-01", "task": "embed", "status": "ok"}
    assert [log.append({**row, "id": f"j{i}"}) for i in range(3)] == [False] * 3
    assert capsys.readouterr().err.count("warning: run log") == 1
    path.rename(tmp_path / "runs.db.bad")
    assert log.append({**row, "id": "after"}) is True
    assert [r["id"] for r in RunLog(path).recent()] == ["after"]


def _size_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_never_blocks_the_job(bert, tmp_path):
    """Simulated with RLIMIT_FSIZE in the child (root too obeys it): every write past 1 KiB into
    a file fails with EFBIG, as writes to a full disk fail with ENOSPC."""
    path = good_log(tmp_path / "runs.db")
    env = dict(os.environ, TASKRUN_LOG_DB=str(path))
    p = subprocess.run(
        [*CLI, "embed", "the cat", "--model", bert, "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        preexec_fn=_size_limit(1024),
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "(32-d)" in p.stdout
    warnings = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: run log {path}"), p.stderr
    assert [row["id"] for row in RunLog(path).recent()] == ["before"]  # the log itself is intact


# --------------------------------------------------------------------------- killed jobs


def test_a_running_row_is_interrupted_once_its_process_is_gone(tmp_path):
    log = RunLog(tmp_path / "runs.db")
    dead = subprocess.Popen(["true"])
    dead.wait()
    me = liveness.stamp()
    rows = {
        "alive": me,
        "dead pid": {**me, "pid": dead.pid, "pid_start": None},
        "pid reused": {**me, "pid_start": "1"},  # this pid, but a process started at another time
        "other host": {**me, "host": "elsewhere", "pid": dead.pid},
    }
    for name, stamp in rows.items():
        log.append({"id": name, "started_at": "2026-01-01", "task": "generate", "status": "running", **stamp})
    status = {row["id"]: row["status"] for row in log.recent(10)}
    assert status == {
        "alive": "running",
        "dead pid": "interrupted",
        "pid reused": "interrupted",
        "other host": "running",
    }
    assert log.get("dead pid")["error"] == liveness.GONE


def _wait_for_row(path: Path, proc: subprocess.Popen, status: str = "running", timeout: float = 120) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, proc.stderr.read()
        if path.exists():
            rows = [r for r in RunLog(path).recent(5) if r["status"] == status]
            if rows:
                return rows[0]
        time.sleep(0.1)
    raise AssertionError(f"no {status} row within {timeout}s")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background shell may start us with it ignored


@pytest.mark.parametrize(
    "sig, code, says", [(signal.SIGTERM, 143, "interrupted by SIGTERM"), (signal.SIGINT, 130, "interrupted (Ctrl-C)")]
)
def test_a_signal_while_waiting_for_stdin_ends_the_job_as_interrupted(sig, code, says, tmp_path):
    path = tmp_path / "runs.db"
    env = dict(os.environ, TASKRUN_LOG_DB=str(path))
    p = subprocess.Popen(
        [*CLI, "generate", "--max-tokens", "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
        preexec_fn=_default_sigint,
    )
    try:
        _wait_for_row(path, p)
        p.send_signal(sig)
        assert p.wait(60) == code
        err = p.stderr.read().decode()
    finally:
        p.kill()
        p.wait()
    assert "Traceback" not in err and "interrupted" in err
    row = RunLog(path).recent(1)[0]
    assert (row["status"], row["error"]) == ("interrupted", says)


def _generate(path: Path, model: str) -> subprocess.Popen:
    env = dict(os.environ, TASKRUN_LOG_DB=str(path))
    return subprocess.Popen(
        [*CLI, "generate", "What is", "--model", model, "--max-tokens", "480"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_job_killed_mid_generation_leaves_an_interrupted_row(sig, tiny_dir, tmp_path):
    path = tmp_path / "runs.db"
    p = _generate(path, str(tiny_llama(tiny_dir)))
    try:
        assert p.stdout.read(1)  # the first token is out: the model is decoding 480 tokens
        p.send_signal(sig)
        code = p.wait(60)
    finally:
        p.kill()
        p.wait()
    assert code == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
    r = invoke("logs", "--json", "--log-db", path)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert len(rows) == 1 and rows[0]["task"] == "generate" and rows[0]["status"] == "interrupted"
    assert rows[0]["pid"] == p.pid
    if sig == signal.SIGTERM:
        assert rows[0]["error"] == "interrupted by SIGTERM" and rows[0]["metrics"]["wall_s"] > 0
    else:
        assert rows[0]["error"] == liveness.GONE
    assert "INTERRUPTED" in invoke("logs", "--log-db", path).stdout


# --------------------------------------------------------------------------- pipes and mistakes


def _shell(command: str, tmp_path: Path) -> tuple[int, str]:
    """``command`` in bash; → (exit status of its first stage, stderr)."""
    script = f"{command} 2>{tmp_path / 'err.txt'} | head -1 >/dev/null; exit ${{PIPESTATUS[0]}}"
    p = subprocess.run(["bash", "-c", script], check=False, cwd=tmp_path, timeout=300)
    return p.returncode, (tmp_path / "err.txt").read_text()


def test_logs_into_a_closed_pipe_ends_quietly(tmp_path, monkeypatch):
    path = good_log(tmp_path / "runs.db", rows=3000)  # far more than a pipe holds (64 KiB)
    code, err = _shell(f"{shlex.join(CLI)} logs -n 3000 --log-db {path}", tmp_path)
    assert (code, err) == (0, "")


def test_a_job_into_a_closed_pipe_ends_quietly_and_is_not_failed(bert, tmp_path):
    path = tmp_path / "runs.db"
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(f"sentence number {i}" for i in range(3000)) + "\n")
    code, err = _shell(f"TASKRUN_LOG_DB={path} {shlex.join(CLI)} embed -f {lines} --model {bert} -q", tmp_path)
    assert (code, err) == (0, "")
    row = RunLog(path).recent(1)[0]
    assert row["status"] in ("ok", "interrupted") and row["status"] != "failed"


def test_invalid_utf8_on_stdin_is_a_clear_error(bert):
    r = CliRunner().invoke(main, ["embed", "--model", bert], input=b"caf\xe9 au lait\n")
    assert r.exit_code == 1
    assert "stdin is not UTF-8 text" in r.stderr and "iconv" in r.stderr
    assert "internal error" not in r.output


@pytest.mark.parametrize("n", ["-1", "0"])
def test_logs_refuses_a_count_below_one(n):
    r = invoke("logs", "-n", n)
    assert r.exit_code == 2 and "-n" in r.stderr
