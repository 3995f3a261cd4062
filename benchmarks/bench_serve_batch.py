"""Continuous batching in `run serve`: 4 concurrent clients against 1, on a llama.cpp GGUF.

    python benchmarks/bench_serve_batch.py --gguf /tmp/qwen/1.5b.gguf [--rounds 2] [--tokens 64]

Two servers on the same GGUF, both with --prompt-cache off (each round resends the same prompts;
a cached prompt would shorten the later rounds' TTFT): ``--parallel 4`` (batched, the default
path) and ``--parallel 1`` (one answer at a time, as before batching: the queue). Each round, in
an order that rotates so a noisy neighbour hits every case: one client alone on the batched
server, 4 clients at once on it, 4 clients at once on the one-at-a-time server. Each client
streams a chat completion at temperature 0 (real `openai` package), distinct prompts.

Reported per case: aggregate tokens/s (every client's completion tokens ÷ first send to last
end) and the clients' TTFT p50 (send → first content chunk); and whether each batched answer
equals the same request's answer alone (temperature 0). Targets (issue 32): 4 clients ≥ 1.5×
one client's tok/s, TTFT p50 ≤ 2× a lone client's. llama-server is not measured here (no
reference build in this run).

Writes benchmarks/results/serve_batch.json.
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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = str(Path(sys.executable).parent / "run")
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that reverses a string, with a docstring.",
    "List three tips for writing clear meeting notes.",
    "Describe what a hash map is to a new programmer.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, folder: Path, toml: Path, parallel: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, TASKRUN_MODELS_TOML=str(toml), TASKRUN_LOG_DB=str(folder / f"runs-{parallel}.db"))
        env.pop("TASKRUN_API_KEY", None)
        self.log = open(folder / f"serve-{parallel}.log", "wb")
        self.proc = subprocess.Popen(
            [RUN, "serve", "--port", str(self.port), "--parallel", str(parallel), "--prompt-cache", "off"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait(self, timeout: float = 120) -> None:
        import httpx

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"run serve exited {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise TimeoutError("run serve did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def one_client(url: str, prompt: str, tokens: int, start: threading.Barrier) -> dict:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    start.wait()
    t0 = time.perf_counter()
    first, text, used = None, [], 0
    stream = client.chat.completions.create(
        model="bench-llm",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    return {"t0": t0, "end": time.perf_counter(), "ttft_s": first, "tokens": used, "text": "".join(text)}


def clients(url: str, prompts: list[str], tokens: int) -> dict:
    start, out = threading.Barrier(len(prompts)), [None] * len(prompts)

    def run(i):
        out[i] = one_client(url, prompts[i], tokens, start)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t0, end = min(r["t0"] for r in out), max(r["end"] for r in out)
    return {
        "aggregate_tokens_per_s": sum(r["tokens"] for r in out) / (end - t0),
        "ttft_p50_s": statistics.median(r["ttft_s"] for r in out),
        "tokens": [r["tokens"] for r in out],
        "texts": [r["text"] for r in out],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-serve-batch-"))
    toml = folder / "models.toml"
    toml.write_text(
        f'[defaults]\ngenerate = "bench-llm"\n\n[models."bench-llm"]\nlocal = {json.dumps(str(args.gguf))}\n'
    )
    batched, serial = Server(folder, toml, 4), Server(folder, toml, 1)
    results: dict[str, list] = {"alone": [], "batched4": [], "serial4": []}
    alone_texts: dict[str, str] = {}
    try:
        batched.wait()
        serial.wait()
        for server in (batched, serial):  # load the model in each before anything is timed
            clients(server.url, PROMPTS[:1], 4)
        for p in PROMPTS:  # the reference answers: each request alone, temperature 0
            alone_texts[p] = clients(batched.url, [p], args.tokens)["texts"][0]
        cases = [
            ("alone", lambda: clients(batched.url, PROMPTS[:1], args.tokens)),
            ("batched4", lambda: clients(batched.url, PROMPTS, args.tokens)),
            ("serial4", lambda: clients(serial.url, PROMPTS, args.tokens)),
        ]
        for r in range(args.rounds):
            for name, case in cases[r % 3 :] + cases[: r % 3]:
                res = case()
                results[name].append(res)
                print(
                    f"round {r} {name:9s} {res['aggregate_tokens_per_s']:6.2f} tok/s  ttft p50 {res['ttft_p50_s']:.3f} s"
                )
    finally:
        batched.stop()
        serial.stop()

    def p50(name, key):
        return statistics.median(x[key] for x in results[name])

    same = sum(t == alone_texts[p] for res in results["batched4"] for p, t in zip(PROMPTS, res["texts"]))
    summary = {
        name: {
            "aggregate_tokens_per_s": round(p50(name, "aggregate_tokens_per_s"), 2),
            "ttft_p50_s": round(p50(name, "ttft_p50_s"), 3),
        }
        for name in results
    }
    summary["ratios"] = {
        "batched4_vs_alone_tokens_per_s": round(
            p50("batched4", "aggregate_tokens_per_s") / p50("alone", "aggregate_tokens_per_s"), 2
        ),
        "serial4_vs_alone_tokens_per_s": round(
            p50("serial4", "aggregate_tokens_per_s") / p50("alone", "aggregate_tokens_per_s"), 2
        ),
        "batched4_vs_alone_ttft_p50": round(p50("batched4", "ttft_p50_s") / p50("alone", "ttft_p50_s"), 2),
        "serial4_vs_alone_ttft_p50": round(p50("serial4", "ttft_p50_s") / p50("alone", "ttft_p50_s"), 2),
    }
    summary["batched_answers_equal_alone"] = f"{same}/{len(results['batched4']) * len(PROMPTS)}"
    summary["setup"] = {
        "gguf": args.gguf.name,
        "bytes": args.gguf.stat().st_size,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "machine": platform.machine(),
        "llama_server": "not measured (no reference build in this run)",
    }
    print(json.dumps(summary, indent=2))
    out = ROOT / "benchmarks" / "results" / "serve_batch.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
