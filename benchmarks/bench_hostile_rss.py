"""serve: the server's memory after hostile requests against after normal ones (issue 33's target:
RSS after 10,000 hostile requests within 10% of its RSS after 10,000 normal ones).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hostile_rss.py [--requests 10000] [--clients 8]

Two fresh `run serve` processes on loopback with the tiny test models (tests/serve_helpers.py),
the same preloads. Each is warmed with the same normal requests, then one gets ``--requests``
normal requests (tiny embeddings, chat, Ollama embed, model lists) and the other as many hostile
ones, the audit's cases (issue 33): a format width in a classify template, bodies nested 10^5
deep, huge seeds and max_tokens, lone surrogates, wrong-typed fields, 80,000 one-letter embed
inputs, text/plain and foreign-Host POSTs, a 300 KB system prompt, a template with positional
fields. Each server's RSS (from /proc) is read after the warm-up and after its requests. Every
hostile answer must be a 4xx, with no traceback in the server's log: either is counted and fails
the run. Writes
benchmarks/results/hostile_rss.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests.serve_helpers import Server, models_toml, server_env, tiny_aliases  # noqa: E402

NORMAL = [
    ("POST", "/v1/embeddings", {"model": "tiny-bert", "input": "a kitten stays with its mother"}),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
    ("POST", "/api/embed", {"model": "tiny-bert", "input": ["one", "two"]}),
    ("GET", "/v1/models", None),
]


def _nested(depth: int) -> str:
    return '{"model": "tiny-bert", "input": ' + "[" * depth + '"x"' + "]" * depth + "}"


CHAT = "/v1/chat/completions"
HOSTILE = [
    (
        "POST",
        "/v1/tasks/classify",
        {"inputs": ["hi"], "options": {"labels": ["a", "b"], "template": "{{}}{:>20000000}"}},
    ),
    ("POST", "/v1/tasks/classify", {"inputs": ["hi"], "options": {"labels": ["a"], "template": "{} {0}"}}),
    ("RAW", "/v1/embeddings", _nested(100_000)),
    (
        "POST",
        CHAT,
        {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "seed": 2**64, "temperature": 1},
    ),
    (
        "RAW",
        CHAT,
        '{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + "9" * 5000 + "}",
    ),
    ("RAW", CHAT, '{"model": "tiny-llama", "messages": [{"role": "user", "content": "\\ud800 hi"}]}'),
    ("POST", "/api/generate", {"model": "tiny-llama", "prompt": "hi", "options": {"num_predict": 4.5}}),
    ("POST", CHAT, {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "stop": 5}),
    ("POST", CHAT, {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
    ("POST", "/api/chat", {"model": "tiny-llama", "messages": [{"role": "system", "content": "s" * 300_000}]}),
    ("POST", "/api/embed", {"model": "tiny-bert", "input": ["a"] * 80_000}),
    ("TEXT", CHAT, json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]})),
    ("HOST", CHAT, json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]})),
    ("POST", "/v1/embeddings", {"model": "tiny-bert", "input": "x", "passage_chars": -5}),
    ("POST", "/v1/images/generations", {"model": "digits-ddpm", "prompt": "x", "size": "1024x1024"}),
]


def send(client: httpx.Client, req) -> int:
    kind, path, body = req
    if kind == "GET":
        return client.get(path).status_code
    if kind == "POST":
        return client.post(path, json=body).status_code
    headers = {"content-type": "text/plain" if kind == "TEXT" else "application/json"}
    if kind == "HOST":
        headers["host"] = "attacker.example"
    return client.post(path, content=body.encode("utf-8", "surrogatepass"), headers=headers).status_code


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def workload(server: Server, reqs: list, n: int, clients: int) -> dict:
    codes: dict[int, int] = {}
    t0 = time.perf_counter()

    def one(i: int) -> int:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            return send(c, reqs[i % len(reqs)])

    with ThreadPoolExecutor(clients) as pool:
        for code in pool.map(one, range(n)):
            codes[code] = codes.get(code, 0) + 1
    return {"seconds": round(time.perf_counter() - t0, 2), "codes": dict(sorted(codes.items()))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--warm", type=int, default=200)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    tiny = root / "tiny"
    tiny.mkdir()
    toml = models_toml(tiny_aliases(tiny), root)
    cache = root / "cache"
    cache.mkdir()
    out: dict = {"requests": args.requests, "clients": args.clients}
    for name, reqs in (("normal", NORMAL), ("hostile", HOSTILE)):
        d = root / name
        d.mkdir()
        server = Server(d, server_env(d, cache, toml), "--preload", "tiny-llama", "--preload", "tiny-bert")
        try:
            server.wait_healthy()
            workload(server, NORMAL, args.warm, args.clients)  # both warmed alike: models, caches, pools
            warm = rss_mb(server.proc.pid)
            ran = workload(server, reqs, args.requests, args.clients)
            after = rss_mb(server.proc.pid)
        finally:
            server.stop()
        tracebacks = server.log_file.read_text(errors="replace").count("Traceback")
        out[name] = {"rss_warm_mb": round(warm, 1), "rss_after_mb": round(after, 1), "tracebacks": tracebacks, **ran}
        print(
            f"{name}: RSS {warm:.0f} MB warm, {after:.0f} MB after {args.requests} requests in {ran['seconds']} s; {ran['codes']}"
        )
    ratio = out["hostile"]["rss_after_mb"] / out["normal"]["rss_after_mb"]
    server_errors = sum(v for k, v in out["hostile"]["codes"].items() if k >= 500) + out["hostile"]["tracebacks"]
    out.update(
        ratio_hostile_over_normal=round(ratio, 3),
        hostile_5xx=server_errors,
        load=os.getloadavg(),
        command="PYTHONPATH=. .venv/bin/python benchmarks/bench_hostile_rss.py "
        f"--requests {args.requests} --clients {args.clients}",
    )
    print(f"RSS after hostile / after normal: {ratio:.3f} (target <= 1.10); hostile 5xx or tracebacks: {server_errors}")
    (ROOT / "benchmarks" / "results" / "hostile_rss.json").write_text(json.dumps(out, indent=2) + "\n")
    if server_errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
