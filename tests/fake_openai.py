"""A tiny OpenAI-compatible server on loopback for the endpoint tests: it answers ``fails`` times
with ``status`` (429, 503), then streams ``answer`` with a ``usage`` chunk. A real HTTP server
(http.server in a thread), so the client's real retry and stream paths run."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Fake(BaseHTTPRequestHandler):
    fails, status, seen = 0, 429, 0
    answer = "the final answer"
    usage = {"prompt_tokens": 5, "completion_tokens": 2}

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        with LOCK:
            cls.seen += 1
            failing = cls.seen <= cls.fails
        if failing:
            self.send_response(cls.status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        half = len(cls.answer) // 2
        for chunk in (
            {"model": "fake-1", "choices": [{"delta": {"content": cls.answer[:half]}}]},
            {"model": "fake-1", "choices": [{"delta": {"content": cls.answer[half:]}, "finish_reason": "stop"}]},
            {"model": "fake-1", "choices": [], "usage": cls.usage},
        ):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self):
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


LOCK = threading.Lock()


@contextmanager
def fake_server(**settings):
    """The base URL (``http://127.0.0.1:PORT/v1``) of a fresh fake server with ``settings``."""
    handler = type("FakeHandler", (Fake,), {"seen": 0, **settings})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
