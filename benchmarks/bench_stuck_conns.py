"""serve: 1,000 stuck connections (slow-loris clients) against /health, issue 33 item 2.

    python benchmarks/bench_stuck_conns.py [--stuck 1000] [--probes 200] [--read-timeout 10]

A `run serve` (no model loaded) on a free loopback port. First /health is timed alone (the
reference, same run): ``--probes`` requests, each on a new connection. Then ``--stuck``
connections are opened and left stuck, half having sent half a request's headers and half
having sent whole headers and half a declared body, and /health is timed again while they are
held. Last, after the server's read timeout, the stuck connections the server has closed are
counted. Target: /health p99 ≤ 1 s while they are held, and every stuck one closed after the
deadline. Writes benchmarks/results/stuck-conns.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = str(Path(sys.executable).parent / "run")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port: int, n: int) -> dict:
    """``n`` GET /health, each on its own connection: latency percentiles (s) and failures."""
    times, failed = [], 0
    for _ in range(n):
        started = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            ok = data.startswith(b"HTTP/1.1 200")
        except OSError:
            ok = False
        times.append(time.perf_counter() - started)
        failed += not ok
    times.sort()
    return {
        "requests": n,
        "failed": failed,
        "p50_s": round(statistics.median(times), 4),
        "p99_s": round(times[min(n - 1, int(n * 0.99))], 4),
        "max_s": round(times[-1], 4),
    }


def stick(port: int, n: int) -> list[socket.socket]:
    socks = []
    body = b'{"model": "minilm", "input": "' + b"x" * 1000 + b'"}'
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        else:
            head = f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            s.sendall(head.encode() + body[: len(body) // 2])
        socks.append(s)
    return socks


def closed(socks: list[socket.socket]) -> int:
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            n += s.recv(65536) == b""
        except BlockingIOError:
            pass  # still open
        except OSError:
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stuck", type=int, default=1000)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--read-timeout", type=float, default=10.0)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.stuck + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
        if min(need, hard) < need:
            raise SystemExit(f"ulimit -n is {hard}; {args.stuck} stuck connections need {need}")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-stuck-"))
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TASKRUN_LOG_DB=str(log_dir / "runs.db"))
    log = open(log_dir / "serve.log", "w")
    cmd = [RUN, "serve", "--port", str(port), "--read-timeout", str(args.read_timeout)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    socks: list[socket.socket] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and probe(port, 1)["failed"]:
            if proc.poll() is not None:
                raise SystemExit(f"run serve exited {proc.returncode}; see {log.name}")
            time.sleep(0.3)
        alone = probe(port, args.probes)
        started = time.monotonic()
        socks = stick(port, args.stuck)
        opened_s = time.monotonic() - started
        held = probe(port, args.probes)
        probed_s = time.monotonic() - started
        time.sleep(max(0.0, args.read_timeout + 3 - (time.monotonic() - started)))
        cut = closed(socks)
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(30)
    server_log = (log_dir / "serve.log").read_text()
    result = {
        "benchmark": "stuck-conns",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "load_average": os.getloadavg(),
        "command": "python " + " ".join(sys.argv),
        "stuck": args.stuck,
        "opened_in_s": round(opened_s, 2),
        "health_alone": alone,
        "health_while_stuck": held,
        "probes_done_within_s": round(probed_s, 2),
        "stuck_closed_by_server_after_deadline": cut,
        "tracebacks_in_server_log": server_log.count("Traceback"),
        "target_p99_s": 1.0,
        "target_met": held["p99_s"] <= 1.0 and held["failed"] == 0 and cut == args.stuck,
    }
    print(json.dumps(result, indent=1))
    out = ROOT / "benchmarks" / "results" / "stuck-conns.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
