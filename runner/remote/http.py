"""The HTTP side of `--server`: POST a job to ``/v1/tasks/{task}`` and read its NDJSON stream.

Python's own ``http.client`` does the HTTP (chunked streaming included): a `--server` call is
meant to take a fraction of a second, and importing httpx alone costs ~0.2 s of CPU, more than
the whole rest of the client. Every failure becomes a one-line TaskError that says what to do:
the server cannot be reached (start it, or run here), it refused the job (its own message, worded
as a local run words it), or the stream broke off (the server's log has the job).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from taskrun.tasks.base import TaskError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # the longest silence between two lines once the job is sent (env TASKRUN_SERVER_TIMEOUT)
MAX_LINE = 256 * 1024 * 1024  # one NDJSON line: the done line carries the job's files as base64
START_HINT = "start one with `run serve`, or unset TASKRUN_SERVER (drop --server) to run the job here"


def base_url(server: str) -> str:
    """``host:port`` or a full URL → ``http(s)://host:port[/prefix]`` without a trailing slash."""
    url = server.strip().rstrip("/")
    if not url:
        raise TaskError("--server is empty; give the server's URL, e.g. --server http://127.0.0.1:8080")
    url = url if "://" in url else "http://" + url
    if not url.startswith(("http://", "https://")):
        raise TaskError(f"--server {server}: give an http:// or https:// URL, e.g. http://127.0.0.1:8080")
    return url


def stream_job(
    server: str,
    api_key: str | None,
    task: str,
    body: dict,
    on_event: Callable[[str, dict], None],
    fix_text: Callable[[str], str] = str,
) -> dict:
    """Send the job; pass each streamed event to ``on_event(kind, data)``; return the ``done``
    event (``{"job": ..., "files": [...]}``). An ``error`` event or an HTTP error raises TaskError
    with the server's message (``fix_text`` names the inputs as the user gave them)."""
    import http.client
    import socket

    url = base_url(server)
    shown = without_password(url)
    headers = {"Content-Type": "application/json", "Accept": "application/x-ndjson"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn = _connection(url)
    sent = False
    try:
        conn.connect()
        conn.sock.settimeout(read_timeout())  # a job may think for minutes between two events, not for ever
        conn.request("POST", f"{_path(url)}/v1/tasks/{task}", body=json.dumps(body).encode(), headers=headers)
        sent = True
        response = conn.getresponse()
        if response.status != 200:
            raise TaskError(fix_text(http_error(shown, response.status, response.read(1 << 20))))
        return read_stream(_lines(response), on_event, fix_text)
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise TaskError(f"cannot reach a taskrun server at {shown} ({_reason(exc)}); {START_HINT}") from None
    except TimeoutError:
        if sent:
            raise TaskError(
                f"the taskrun server at {shown} sent nothing for {read_timeout():g} s during the job; "
                "see the server's log (TASKRUN_SERVER_TIMEOUT=SECONDS waits longer)"
            ) from None
        raise TaskError(
            f"the taskrun server at {shown} did not answer within {CONNECT_TIMEOUT_S:g} s; "
            f"check that it is running, or {START_HINT}"
        ) from None
    except (http.client.HTTPException, OSError) as exc:
        raise TaskError(
            f"lost the connection to the taskrun server at {shown} during the job "
            f"({type(exc).__name__}: {exc}); see the server's log"
        ) from None
    finally:
        conn.close()


def read_timeout() -> float:
    import os

    try:
        return max(1.0, float(os.environ.get("TASKRUN_SERVER_TIMEOUT") or READ_TIMEOUT_S))
    except ValueError:
        return READ_TIMEOUT_S


def without_password(url: str) -> str:
    """``url`` as an error line may show it: ``http://user:pw@host`` → ``http://user@host``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}@{host}" if parts.username else host))


def _connection(url: str):
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "127.0.0.1", parts.port, timeout=CONNECT_TIMEOUT_S)


def _path(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).path.rstrip("/")


def _lines(response) -> Iterator[str]:
    """The response's lines as they arrive (http.client undoes the chunked encoding)."""
    while True:
        line = response.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE:
            raise TaskError(f"the server sent a line over {MAX_LINE >> 20} MiB; is --server a taskrun server?")
        yield line.decode("utf-8", "replace")


def read_stream(lines, on_event: Callable[[str, dict], None], fix_text: Callable[[str], str]) -> dict:
    """The NDJSON lines of a job: events to ``on_event`` until ``done`` (returned) or ``error``."""
    for line in lines:
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            raise TaskError(
                f"the server sent a line that is not JSON ({line[:80]!r}); is --server "
                f"the URL of a taskrun server (`run serve`)?"
            ) from None
        kind = data.get("event") if isinstance(data, dict) else None
        if kind == "done":
            return _checked_done(data)
        if kind == "error":
            raise TaskError(fix_text(_message(data.get("error"))))
        if kind:
            on_event(kind, data)
    raise TaskError("the server ended the job's stream without its result; see the server's log")


def http_error(server: str, status: int, content: bytes) -> str:
    """A refused request as one line: the server's own message, plus what to do where it is ours."""
    try:
        error = json.loads(content).get("error")
    except (ValueError, AttributeError):
        error = None
    message = _message(error) if error else content.decode("utf-8", "replace").strip()[:200] or f"HTTP {status}"
    if status == 401:
        return f"{message} (give the server's key with --api-key or TASKRUN_API_KEY)"
    if status == 404 and not error:  # not taskrun's error shape: something else answers there
        return f"{base_url(server)} answered 404 for /v1/tasks: is it a taskrun server (`run serve`)? ({message})"
    if status == 503:
        return f"{message} (the server is busy; try again shortly)"
    return message


def _checked_done(data: dict) -> dict:
    """The done line's fields of the types the client reads (a job object, files of name and
    base64 text), so a wrong server fails with one line rather than deep in the printing."""
    job, files = data.get("job"), data.get("files", [])
    ok = isinstance(job, dict) and isinstance(job.get("items", []), list) and isinstance(files, list)
    ok = ok and all(
        isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("data"), str) for f in files
    )
    if not ok:
        raise TaskError(
            "the server's result is not a taskrun job (a 'done' line of the wrong shape); is --server a taskrun server?"
        )
    return data


def _message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or "the server reported an error without a message")


def _reason(exc: Exception) -> str:
    return "connection refused" if isinstance(exc, ConnectionRefusedError) else f"cannot resolve the host: {exc}"
