"""Read deadlines and a connection limit under uvicorn's HTTP/1.1 protocol (h11).

uvicorn bounds only an idle keep-alive connection: a client that sends half a request's headers,
or declares a body and sends half of it, holds its socket (and a task awaiting the body) for
ever, and ``limit_concurrency`` counts such connections too, so a few hundred stuck ones would
turn every other client away. Here each connection, while it is the client's turn to send:

- has ``read_timeout_s`` from its opening (or from its previous answer) to send whole headers;
- may pause at most ``read_timeout_s`` between two pieces of its body, and must finish a body
  within ``read_timeout_s`` plus its length at ``MIN_BODY_RATE`` bytes a second;

past that it is closed (the job, if one waits on the body, sees the client gone). Over
``max_connections`` open ones, the one that has waited longest on its client is closed to make
room; when none is waiting, the new one is answered 503. Closed connections are counted in the
log, one line per ``LOG_EVERY_S`` at most, not one traceback each.
"""

from __future__ import annotations

import logging
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("taskrun.serve")

MIN_BODY_RATE = 100_000  # bytes/s a body upload must average: 25 MB in about 4 minutes
LOG_EVERY_S = 10.0
CUT = "taskrun.cut"  # a scope key: this server closed the connection
_BUSY_BODY = (
    b'{"error":{"message":"this server has too many open connections; retry in a moment",'
    b'"type":"server_error","param":null,"code":"server_busy"}}'
)
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\nretry-after: 1\r\n"
    + f"content-length: {len(_BUSY_BODY)}\r\n\r\n".encode()
    + _BUSY_BODY
)


class _Tally:
    """Closed connections by reason: the first logged at once, later ones summed into one line
    every LOG_EVERY_S at most."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last = -LOG_EVERY_S
        self.pending = False

    def add(self, reason: str, loop) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if self.pending:
            return
        wait = self.last + LOG_EVERY_S - time.monotonic()
        if wait <= 0:
            self.flush()
        else:
            self.pending = True
            loop.call_later(wait, self.flush)

    def flush(self) -> None:
        self.pending, self.last = False, time.monotonic()
        if self.counts:
            said = ", ".join(f"{n} {why}" for why, n in self.counts.items())
            log.warning("closed connections whose client stalled: %s", said)
            self.counts.clear()


class Guarded(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the limit above (configured by guarded_protocol)."""

    read_timeout_s = 10.0
    max_connections = 2048
    max_body = 25 * 1024 * 1024
    tally: _Tally

    _timer = None
    _phase: str | None = None  # "headers" or "body" while the client owes bytes; None otherwise
    _since = 0.0
    _body_deadline = 0.0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._track()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track(got_data=True)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._phase = None
        super().connection_lost(exc)

    # ------------------------------------------------------------------ deadlines

    def _track(self, got_data: bool = False) -> None:
        state = self.conn.their_state
        now = time.monotonic()
        if state is h11.IDLE:
            if self._phase != "headers":  # a new wait: the clock starts once, not per piece
                self._phase, self._since = "headers", now
                self._arm(self.read_timeout_s)
        elif state is h11.SEND_BODY:
            if self._phase != "body":
                self._phase, self._since = "body", now
                length = _content_length(self.headers) if self.headers else None
                self._body_deadline = now + self.read_timeout_s + (length or self.max_body) / MIN_BODY_RATE
                self._arm(min(self.read_timeout_s, self._body_deadline - now))
            elif got_data:
                self._arm(min(self.read_timeout_s, self._body_deadline - now))
        elif self._phase is not None:  # the request is in: the answer's time is the job's
            self._phase = None
            self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(max(seconds, 0.0), self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self.tally.add("sent no whole headers in time" if self._phase == "headers" else "stalled in a body", self.loop)
        self._cut()

    def _cut(self) -> None:
        self._phase = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.scope[CUT] = True  # app.py: counted here, not logged again as a client leaving
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.abort()

    def _make_room(self) -> None:
        waiting = [c for c in self.connections if c is not self and getattr(c, "_phase", None)]
        if waiting:
            oldest = min(waiting, key=lambda c: c._since)
            self.tally.add("closed to make room for new ones", self.loop)
            oldest._disarm()
            oldest._cut()
        else:
            self._disarm()
            self._phase = None
            self.transport.write(BUSY)
            self.transport.close()


def guarded_protocol(read_timeout_s: float, max_connections: int, max_body: int) -> type[H11Protocol]:
    """The protocol class with these deadlines and this limit (pass as ``uvicorn.run(http=...)``)."""
    attrs = {"read_timeout_s": read_timeout_s, "max_connections": max_connections, "max_body": max_body}
    return type("Guarded", (Guarded,), {**attrs, "tally": _Tally()})


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def raise_open_files(wanted: int) -> int:
    """Raise this process's soft open-file limit towards ``wanted`` (within the hard one, as
    Ollama and nginx do); the connections it then allows, with room for models and logs."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted + 256
    if soft != resource.RLIM_INFINITY and soft < target:
        new = target if hard == resource.RLIM_INFINITY else min(target, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else max(16, min(wanted, soft - 256))
