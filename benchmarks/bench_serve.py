"""serve: a warm `run serve` against the cold CLI, and the server under concurrent load.

    python benchmarks/bench_serve.py [--runs 20] [--cold-runs 3] [--rounds 5] [--quick]
                                     [--only latency,embed16,generate4]

1. Warm latency per task: `run TASK … --server URL` against the plain cold `run TASK …`, both as
   a user runs them (a new `run` process each time, wall clock from spawn to exit), interleaved
   (cold, warm, warm, …) so a noisy neighbour hits both: `embed "hello"`, a 5 s clip cut from
   samples/meeting.wav, a 16-token generate. p50/p95 of each. Target: warm embed ≤ 0.3 s.
2. Embeddings, 16 concurrent clients with one sentence each (POST /v1/embeddings): requests/s on
   one server with dynamic batching and one started with --no-batching, rounds interleaved.
3. Generate, 4 concurrent streams (POST /v1/tasks/generate, streamed): per-stream time to first
   token and aggregate tokens/s, against one stream alone. The server runs one job per model at
   a time (its engine holds one KV cache), so concurrent streams queue: the TTFT shows it.
   llama.cpp's server is measured where `llama_cpp.server` is installed; otherwise the result
   says that it is not.

Writes benchmarks/results/serve.json (serve-quick.json with --quick). Needs the packaged models
(minilm, whisper-tiny.en, smollm2-135m); everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
RUN = str(Path(sys.executable).parent / "run")
SENTENCES = [
    "The meeting moved to Thursday.",
    "Prices rose in March.",
    "Alice owns the budget.",
    "The cat sat on the mat.",
    "Ship the release on Friday.",
    "Bob reviews the tests.",
    "Rain is expected tomorrow.",
    "The model loads once.",
    "Queues keep memory bounded.",
    "Search finds the passage.",
    "A short clip of speech.",
    "Vectors for similarity.",
    "The server stays warm.",
    "Batching merges requests.",
    "Latency is what users feel.",
    "Throughput is what servers sell.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str], log_dir: Path, name: str) -> tuple[subprocess.Popen, str]:
    """A `run serve` on a free loopback port, its models preloaded; returns once /health is ready."""
    import httpx

    port = free_port()
    cmd = [
        RUN,
        "serve",
        "--port",
        str(port),
        "--preload",
        "minilm",
        "--preload",
        "whisper-tiny.en",
        "--preload",
        "smollm2-135m",
        *extra,
    ]
    log = open(log_dir / f"{name}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=bench_env(log_dir / f"{name}.db"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"`{' '.join(cmd)}` exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"the server did not get ready in 10 minutes; see {log.name}")


def bench_env(log_db: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TASKRUN_LOG_DB=str(log_db))
    env.pop("TASKRUN_SERVER", None)
    return env


def clip(seconds: float, folder: Path) -> Path:
    """The first ``seconds`` of samples/meeting.wav, as its own file."""
    import soundfile as sf

    audio, rate = sf.read(ROOT / "samples" / "meeting.wav")
    out = folder / f"meeting-{seconds:g}s.wav"
    sf.write(out, audio[: int(seconds * rate)], rate)
    return out


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks; the value itself for one."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(times: list[float]) -> dict:
    return {
        "n": len(times),
        "p50_s": round(pct(times, 50), 3),
        "p95_s": round(pct(times, 95), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
    }


def timed_run(args: list[str], env: dict) -> float:
    t = time.perf_counter()
    done = subprocess.run([RUN, *args, "-q"], env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if done.returncode:
        raise SystemExit(f"`run {' '.join(args)}` failed: {done.stderr.strip()[-500:]}")
    return dt


def latency(url: str, jobs: dict[str, list[str]], runs: int, cold_runs: int, log_dir: Path) -> dict:
    """Per job: cold CLI and warm --server wall times, interleaved; p50/p95 of each."""
    env = bench_env(log_dir / "cli.db")
    out = {}
    for name, args in jobs.items():
        warm, cold = [], []
        timed_run([*args, "--server", url], env)  # the server's first job of this kind is not "warm"
        for i in range(max(runs, cold_runs)):
            if i < cold_runs:
                cold.append(timed_run(args, env))
            if i < runs:
                warm.append(timed_run([*args, "--server", url], env))
        out[name] = {
            "command": "run " + " ".join(args),
            "cold_cli": summary(cold),
            "warm_server": summary(warm),
            "speedup_p50": round(pct(cold, 50) / pct(warm, 50), 1),
        }
        print(
            f"{name:<12} cold p50 {pct(cold, 50):7.2f} s  p95 {pct(cold, 95):7.2f} s   "
            f"--server p50 {pct(warm, 50):6.3f} s  p95 {pct(warm, 95):6.3f} s"
        )
    return out


def embed_round(url: str, clients: int) -> float:
    """``clients`` concurrent /v1/embeddings requests of one sentence each → requests per second."""
    import httpx

    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=clients)) as client:

        def one(i: int) -> None:
            r = client.post(url + "/v1/embeddings", json={"model": "minilm", "input": SENTENCES[i % len(SENTENCES)]})
            r.raise_for_status()

        with ThreadPoolExecutor(clients) as pool:
            one(0)  # connections are open and the model is warm before the clock starts
            t = time.perf_counter()
            list(pool.map(one, range(clients)))
            return clients / (time.perf_counter() - t)


def embed_concurrency(batched: str, unbatched: str, rounds: int, clients: int = 16) -> dict:
    on, off = [], []
    for _ in range(rounds):
        on.append(embed_round(batched, clients))
        off.append(embed_round(unbatched, clients))
    ratio = statistics.median(on) / statistics.median(off)
    print(
        f"embed x{clients} clients  batching {statistics.median(on):7.1f} req/s   "
        f"no batching {statistics.median(off):7.1f} req/s   ratio {ratio:.2f}x (median of {rounds})"
    )
    return {
        "clients": clients,
        "rounds": rounds,
        "batching_req_per_s": [round(x, 1) for x in on],
        "no_batching_req_per_s": [round(x, 1) for x in off],
        "ratio_median": round(ratio, 2),
    }


def generate_streams(url: str, streams: int, max_tokens: int) -> dict:
    """``streams`` concurrent streamed generate jobs: each one's TTFT (request → first token) and
    the aggregate tokens/s over the wall time of all of them."""
    from taskrun.runner.remote.http import stream_job

    def one(i: int) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        first: list[float] = []

        def on_event(kind: str, data: dict) -> None:
            if kind == "token" and not first:
                first.append(time.perf_counter() - t0)

        body = {
            "input": [{"text": f"Write a short note about item {i}."}],
            "model": "smollm2-135m",
            "options": {"max_tokens": max_tokens, "seed": i},
            "stream": True,
        }
        done = stream_job(url, None, "generate", body, on_event)
        tokens = sum(it["result"]["output_tokens"] for it in done["job"]["items"])
        return (first[0] if first else float("nan")), time.perf_counter() - t0, tokens

    t = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(one, range(streams)))
    wall = time.perf_counter() - t
    tokens = sum(r[2] for r in results)
    return {
        "streams": streams,
        "max_tokens": max_tokens,
        "ttft_s": [round(r[0], 3) for r in results],
        "stream_wall_s": [round(r[1], 3) for r in results],
        "tokens": tokens,
        "aggregate_tokens_per_s": round(tokens / wall, 1),
        "wall_s": round(wall, 3),
    }


def generate_concurrency(url: str, max_tokens: int) -> dict:
    generate_streams(url, 1, 4)  # warm
    alone = generate_streams(url, 1, max_tokens)
    four = generate_streams(url, 4, max_tokens)
    print(f"generate x1 stream   {alone['aggregate_tokens_per_s']:6.1f} tok/s  ttft {alone['ttft_s'][0]:.3f} s")
    print(f"generate x4 streams  {four['aggregate_tokens_per_s']:6.1f} tok/s  ttft {four['ttft_s']} s")
    return {
        "one_stream": alone,
        "four_streams": four,
        "server_does": "queues: one job per model at a time",
        "llama_cpp_server": llama_cpp_status(),
    }


def llama_cpp_status() -> str:
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        return (
            f"not measured: llama_cpp.server is not installed here ({exc}); `pip install "
            f"'llama-cpp-python[server]'` builds llama.cpp from source, which this machine cannot "
            f"download"
        )
    return "installed, but not measured by this script yet"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20, help="warm --server runs per task")
    ap.add_argument("--cold-runs", type=int, default=3, help="cold CLI runs per task")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of 16 concurrent embeddings")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per stream in the generate test")
    ap.add_argument("--only", default="latency,embed16,generate4", help="which parts to run")
    ap.add_argument("--quick", action="store_true", help="3 warm runs, 1 cold, 1 round: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.cold_runs, args.rounds, args.max_tokens = 3, 1, 1, 16
    parts = set(args.only.split(","))
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    from taskrun.runner.bench.host import host

    result = {
        "benchmark": "serve",
        "quick": args.quick,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "host": host(bandwidth=True),
        "command": "python " + " ".join(sys.argv),
        "server_logs": str(log_dir),
    }
    servers = []
    try:
        proc, url = start_server([], log_dir, "batching")
        servers.append(proc)
        if "latency" in parts:
            jobs = {
                "embed": ["embed", "hello"],
                "transcribe": ["transcribe", str(clip(5.0, log_dir))],
                "generate": ["generate", "Say hello.", "--max-tokens", "16", "--seed", "0"],
            }
            result["latency"] = latency(url, jobs, args.runs, args.cold_runs, log_dir)
            warm = result["latency"]["embed"]["warm_server"]["p50_s"]
            result["target_warm_embed_p50_s"], result["target_met"] = 0.3, warm <= 0.3
            print(
                f"target: warm `run embed hello --server` p50 ≤ 0.3 s: {'met' if warm <= 0.3 else 'NOT met'} ({warm} s)"
            )
        if "embed16" in parts:
            proc2, url2 = start_server(["--no-batching"], log_dir, "no-batching")
            servers.append(proc2)
            result["embed_16_clients"] = embed_concurrency(url, url2, args.rounds)
        if "generate4" in parts:
            result["generate_4_streams"] = generate_concurrency(url, args.max_tokens)
    finally:
        for p in servers:
            p.terminate()
            p.wait(30)
    out = ROOT / "benchmarks" / "results" / ("serve-quick.json" if args.quick else "serve.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
