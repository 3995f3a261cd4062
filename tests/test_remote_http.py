"""Issue 33 item 16, the `--server` client's HTTP side against real sockets: a server that goes
silent after the job is sent, a line without end, a result of the wrong shape, and a URL with a
password that must not reach the error line."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from taskrun.runner.remote.http import stream_job
from taskrun.tasks.base import TaskError

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n"


def fake_server(answer: bytes, hold_s: float = 5.0) -> int:
    """A one-connection server that reads the request, sends ``answer`` and then holds the socket."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn, listener:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(answer)
            time.sleep(hold_s)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def job(port: int, server: str | None = None):
    return stream_job(server or f"http://127.0.0.1:{port}", None, "embed", {"input": ["x"]}, lambda *_: None, str)


def test_a_server_silent_after_the_job_is_sent_times_out(monkeypatch):
    monkeypatch.setenv("TASKRUN_SERVER_TIMEOUT", "1")
    port = fake_server(HEAD)  # headers, then nothing
    started = time.monotonic()
    with pytest.raises(TaskError, match="sent nothing for 1 s"):
        job(port)
    assert time.monotonic() - started < 4


def test_a_done_line_of_the_wrong_shape_is_one_clear_error():
    port = fake_server(HEAD + b'{"event": "done", "job": "not a job", "files": 5}\n', hold_s=0)
    with pytest.raises(TaskError, match="wrong shape"):
        job(port)


def test_a_line_past_the_bound_is_refused(monkeypatch):
    monkeypatch.setattr("taskrun.runner.remote.http.MAX_LINE", 1000)
    port = fake_server(HEAD + b'{"event": "notice", "message": "' + b"x" * 5000, hold_s=0)
    with pytest.raises(TaskError, match="over"):
        job(port)


def test_no_password_in_the_error_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(TaskError) as err:
        job(port, f"http://alice:hunter2@127.0.0.1:{port}")
    assert "hunter2" not in str(err.value) and f"alice@127.0.0.1:{port}" in str(err.value)
