"""Continuous batching in `run serve`: 4 concurrent clients against 1, on a llama.cpp GGUF.

    python benchmarks/bench_serve_batch.py --gguf /tmp/qwen/1.5b.gguf [--rounds 2] [--tokens 64]
        [--llama-server PATH] [--threads N] [--cases alone,llama_alone,...] [--out NAME.json]

Two servers on the same GGUF, both with --prompt-cache off (each round resends the same prompts;
a cached prompt would shorten the later rounds' TTFT): ``--parallel 4`` (batched, the default
path) and ``--parallel 1`` (one answer at a time, as before batching: the queue). Each round, in
an order that rotates so a noisy neighbour hits every case: one client alone on the batched
server, 4 clients at once on it, 4 clients at once on the one-at-a-time server. Each client
streams a chat completion at temperature 0 (real `openai` package), distinct prompts.

Reported per case: aggregate tokens/s (every client's completion tokens ÷ first send to last
end) and the clients' TTFT p50 (send → first content chunk); and whether each batched answer
equals the same request's answer alone (temperature 0). Targets (issue 32): 4 clients ≥ 1.5×
one client's tok/s, TTFT p50 ≤ 2× a lone client's.

With ``--llama-server PATH`` (llama.cpp's own server, built from the llama.cpp llama-cpp-python
vendors: benchmarks/llama_server.py has the commands), the same requests also go to a
``llama-server --parallel 4`` and a ``--parallel 1`` on the same GGUF, each case of taskrun's and
its llama-server twin back to back, taskrun first on even rounds and llama-server first on odd
ones; the 1-client cases are the single-stream comparison (on ``--parallel 4`` servers, and on
``--parallel 1`` ones: ``alone_p1``, taskrun's single-stream engine). Ratios taskrun ÷ llama-server:
decode tok/s (a client's tokens after the first over their time), TTFT p50, aggregate tok/s at
4 clients (issue 32: decode ≥ 1.0×, TTFT ≤ 1.0×, 4-client aggregate ≥ 1.0×). Both servers get
the same threads (``--threads``, 2 by default then: taskrun's TASKRUN_DECODE_THREADS and
TASKRUN_THREADS, llama-server's -t/-tb), and both kernel levels are written down.

Writes benchmarks/results/serve_batch.json (serve_batch_vs_llama_server.json with
--llama-server; --out names another).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from llama_server import LlamaServer, wait_healthy

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
    def __init__(self, folder: Path, toml: Path, parallel: int, threads: int = 0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, TASKRUN_MODELS_TOML=str(toml), TASKRUN_LOG_DB=str(folder / f"runs-{parallel}.db"))
        env.pop("TASKRUN_API_KEY", None)
        if threads:  # fixed threads for one token and for prompts (else: the cores free at the time)
            env.update(TASKRUN_DECODE_THREADS=str(threads), TASKRUN_THREADS=str(threads))
        self.log = open(folder / f"serve-{parallel}.log", "wb")
        self.proc = subprocess.Popen(
            [RUN, "serve", "--port", str(self.port), "--parallel", str(parallel), "--prompt-cache", "off"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait(self, timeout: float = 120) -> None:
        wait_healthy(self.url, self.proc, "run serve", timeout)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def one_client(url: str, prompt: str, tokens: int, start: threading.Barrier, extra: dict | None = None) -> dict:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    start.wait()
    t0 = time.perf_counter()
    first, text, used, prompt_tokens, timings = None, [], 0, 0, None
    stream = client.chat.completions.create(
        model="bench-llm",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            used, prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        timings = (chunk.model_extra or {}).get("timings") or timings  # llama-server's own, last chunk
    end = time.perf_counter()
    # decode: the tokens after the first over their time, as the client sees them stream
    decode = (used - 1) / (end - t0 - first) if first is not None and used > 1 and end > t0 + first else None
    return {
        "t0": t0,
        "end": end,
        "ttft_s": first,
        "decode_tokens_per_s": decode,
        "tokens": used,
        "prompt_tokens": prompt_tokens,
        "server_timings": timings,
        "text": "".join(text),
    }


def step_rows(url: str) -> tuple[float, float, float]:
    """(steps, sequences in them, llama_decode passes that read prompts) so far from taskrun's
    /metrics (taskrun_batch_step_sequences, taskrun_batch_prompt_pass_prompts); zeros from a
    server without them (llama-server)."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0, 0.0, 0.0
    got = dict(re.findall(r"^taskrun_batch_step_sequences_(count|sum)\{[^}]*\} (\S+)$", text, re.M))
    passes = re.findall(r"^taskrun_batch_prompt_pass_prompts_count\{[^}]*\} (\S+)$", text, re.M)
    return float(got.get("count", 0)), float(got.get("sum", 0)), sum(float(x) for x in passes)


def clients(url: str, prompts: list[str], tokens: int, extra: dict | None = None) -> dict:
    steps0, rows0, passes0 = step_rows(url) if extra is None else (0.0, 0.0, 0.0)
    start, out = threading.Barrier(len(prompts)), [None] * len(prompts)

    def run(i):
        out[i] = one_client(url, prompts[i], tokens, start, extra)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t0, end = min(r["t0"] for r in out), max(r["end"] for r in out)
    steps1, rows1, passes1 = step_rows(url) if extra is None else (0.0, 0.0, 0.0)
    return {
        # taskrun's batched decode steps in this case, and the sequences per step (4 at best)
        "steps": steps1 - steps0,
        "rows_per_step": (rows1 - rows0) / (steps1 - steps0) if steps1 > steps0 else None,
        "prompt_passes": passes1 - passes0,  # llama_decode calls that read prompt tokens (1: all together)
        "aggregate_tokens_per_s": sum(r["tokens"] for r in out) / (end - t0),
        "ttft_p50_s": statistics.median(r["ttft_s"] for r in out),
        "decode_tokens_per_s_p50": statistics.median(r["decode_tokens_per_s"] or 0.0 for r in out),
        "tokens": [r["tokens"] for r in out],
        "prompt_tokens": [r["prompt_tokens"] for r in out],
        "server_timings": [r["server_timings"] for r in out],
        "texts": [r["text"] for r in out],
        "load_avg_1m": os.getloadavg()[0],
    }


def kernels(system_info: str) -> str:
    from taskrun.pipelines.llm.llamacpp_native import kernel_level

    return kernel_level(system_info)


def summarise(results: dict, alone_texts: dict) -> dict:
    def p50(name, key):
        return statistics.median(x[key] for x in results[name])

    summary = {
        name: {
            "aggregate_tokens_per_s": round(p50(name, "aggregate_tokens_per_s"), 2),
            "ttft_p50_s": round(p50(name, "ttft_p50_s"), 3),
            "decode_tokens_per_s_p50": round(p50(name, "decode_tokens_per_s_p50"), 2),
            "prompt_tokens": results[name][0]["prompt_tokens"],
            "load_avg_1m": [round(x["load_avg_1m"], 2) for x in results[name]],
            "batched_steps": [x.get("steps") for x in results[name]],
            "rows_per_step": [round(x["rows_per_step"], 2) if x.get("rows_per_step") else None for x in results[name]],
            "prompt_passes": [x.get("prompt_passes") for x in results[name]],
        }
        for name in results
        if results[name]
    }

    def ratio(a, b, key):  # None where a case was not timed (--cases)
        return round(p50(a, key) / p50(b, key), 2) if results.get(a) and results.get(b) else None

    summary["ratios"] = {
        "batched4_vs_alone_tokens_per_s": ratio("batched4", "alone", "aggregate_tokens_per_s"),
        "serial4_vs_alone_tokens_per_s": ratio("serial4", "alone", "aggregate_tokens_per_s"),
        "batched4_vs_alone_ttft_p50": ratio("batched4", "alone", "ttft_p50_s"),
        "serial4_vs_alone_ttft_p50": ratio("serial4", "alone", "ttft_p50_s"),
    }
    same = sum(t == alone_texts[p] for res in results["batched4"] for p, t in zip(PROMPTS, res["texts"]))
    summary["batched_answers_equal_alone"] = f"{same}/{len(results['batched4']) * len(PROMPTS)}"
    if "llama_alone" in results:  # taskrun / llama-server, each the median over the rounds
        summary["vs_llama_server"] = {
            "single_decode_tokens_per_s": ratio("alone", "llama_alone", "decode_tokens_per_s_p50"),
            "single_ttft_p50": ratio("alone", "llama_alone", "ttft_p50_s"),
            "single_aggregate_tokens_per_s": ratio("alone", "llama_alone", "aggregate_tokens_per_s"),
            # one client on --parallel 1 servers: taskrun's single-stream engine, llama-server's one slot
            "single_p1_decode_tokens_per_s": ratio("alone_p1", "llama_alone_p1", "decode_tokens_per_s_p50"),
            "single_p1_ttft_p50": ratio("alone_p1", "llama_alone_p1", "ttft_p50_s"),
            "batched4_aggregate_tokens_per_s": ratio("batched4", "llama_batched4", "aggregate_tokens_per_s"),
            "batched4_ttft_p50": ratio("batched4", "llama_batched4", "ttft_p50_s"),
            "llama_batched4_vs_llama_alone_tokens_per_s": ratio(
                "llama_batched4", "llama_alone", "aggregate_tokens_per_s"
            ),
        }
        same = sum(t == alone_texts[p] for res in results["llama_batched4"] for p, t in zip(PROMPTS, res["texts"]))
        summary["llama_batched4_answers_equal_taskrun_alone"] = (
            f"{same}/{len(results['llama_batched4']) * len(PROMPTS)}"
        )
        for case in ("llama_alone", "llama_alone_p1"):
            timings = [t for res in results.get(case, []) for t in res["server_timings"] if t]
            if timings:  # llama-server's own split of the lone request: prompt read vs decode
                summary[f"{case}_server_timings_p50"] = {
                    k: round(statistics.median(t[k] for t in timings), 2)
                    for k in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_per_second")
                    if all(k in t for t in timings)
                }
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument(
        "--llama-server",
        type=Path,
        help="a llama-server binary (built as benchmarks/llama_server.py says): also measure it, same requests",
    )
    ap.add_argument(
        "--cases",
        help="comma-separated cases to time (default: all): alone, batched4, serial4, alone_p1 and, with "
        "--llama-server, llama_alone, llama_batched4, llama_alone_p1",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="threads for every server, one token and prompts alike (default: 2 with --llama-server, "
        "else taskrun picks the cores free at the time)",
    )
    ap.add_argument("--out", help="file name under benchmarks/results/ (default: by whether llama-server ran)")
    args = ap.parse_args()
    threads = args.threads if args.threads is not None else (2 if args.llama_server else 0)
    folder = Path(tempfile.mkdtemp(prefix="bench-serve-batch-"))
    toml = folder / "models.toml"
    toml.write_text(
        f'[defaults]\ngenerate = "bench-llm"\n\n[models."bench-llm"]\nlocal = {json.dumps(str(args.gguf))}\n'
    )
    batched, serial = Server(folder, toml, 4, threads), Server(folder, toml, 1, threads)
    ref = LlamaServer(args.llama_server, args.gguf, folder, 4, threads or 2) if args.llama_server else None
    ref1 = LlamaServer(args.llama_server, args.gguf, folder, 1, threads or 2) if args.llama_server else None
    no_cache = {"cache_prompt": False}  # llama-server's prompt cache off, as taskrun's --prompt-cache off
    results: dict[str, list] = {"alone": [], "batched4": [], "serial4": [], "alone_p1": []}
    alone_texts: dict[str, str] = {}
    try:
        batched.wait()
        serial.wait()
        for server in (batched, serial):  # load the model in each before anything is timed
            clients(server.url, PROMPTS[:1], 4)
        if ref and ref1:
            for server in (ref, ref1):
                server.wait()
                clients(server.url, PROMPTS[:1], 4, no_cache)
            results.update(llama_alone=[], llama_batched4=[], llama_alone_p1=[])
        for p in PROMPTS:  # the reference answers: each request alone, temperature 0
            alone_texts[p] = clients(batched.url, [p], args.tokens)["texts"][0]
        cases = {
            "alone": lambda: clients(batched.url, PROMPTS[:1], args.tokens),
            "batched4": lambda: clients(batched.url, PROMPTS, args.tokens),
            "serial4": lambda: clients(serial.url, PROMPTS, args.tokens),
            "alone_p1": lambda: clients(serial.url, PROMPTS[:1], args.tokens),
        }
        groups = [["alone"], ["batched4"], ["serial4"], ["alone_p1"]]
        if ref and ref1:
            cases["llama_alone"] = lambda: clients(ref.url, PROMPTS[:1], args.tokens, no_cache)
            cases["llama_batched4"] = lambda: clients(ref.url, PROMPTS, args.tokens, no_cache)
            cases["llama_alone_p1"] = lambda: clients(ref1.url, PROMPTS[:1], args.tokens, no_cache)
            groups = [
                ["alone", "llama_alone"],
                ["batched4", "llama_batched4"],
                ["serial4"],
                ["alone_p1", "llama_alone_p1"],
            ]
        if args.cases:
            wanted = set(args.cases.split(","))
            groups = [g for g in ([n for n in group if n in wanted] for group in groups) if g]
        for r in range(args.rounds):
            # the order rotates so a noisy neighbour hits every case; each pair of contenders
            # runs back to back, taskrun first on even rounds and llama-server first on odd ones
            k = r % len(groups)
            for group in groups[k:] + groups[:k]:
                for name in group if r % 2 == 0 else group[::-1]:
                    res = cases[name]()
                    results[name].append(res)
                    print(
                        f"round {r} {name:15s} {res['aggregate_tokens_per_s']:6.2f} tok/s  "
                        f"decode p50 {res['decode_tokens_per_s_p50']:6.2f} tok/s  "
                        f"ttft p50 {res['ttft_p50_s']:.3f} s  load {res['load_avg_1m']:.2f}",
                        flush=True,
                    )
    finally:
        batched.stop()
        serial.stop()
        for server in (ref, ref1):
            if server:
                server.stop()

    from taskrun.pipelines.llm.llamacpp_native import kernel_note

    summary = summarise(results, alone_texts)
    summary["setup"] = {
        "gguf": args.gguf.name,
        "bytes": args.gguf.stat().st_size,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "threads": threads or "taskrun: the cores free at the time",
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "machine": platform.machine(),
        "taskrun_kernels": kernel_note(),  # the library the server chose as it did (llamacpp_kernels)
        "llama_server": "not measured (no --llama-server given)",
        "logs": str(folder),  # the servers' logs and run logs (prefill_s per job in runs-N.db)
    }
    if ref and ref1:
        summary["setup"]["llama_server"] = {
            "command": " ".join(ref.cmd),
            "command_p1": " ".join(ref1.cmd),
            "version": ref.version(),
            "kernels": kernels(ref.system_info()),
            "system_info": ref.system_info(),
        }
    print(json.dumps(summary, indent=2))
    name = args.out or ("serve_batch_vs_llama_server.json" if ref else "serve_batch.json")
    out = ROOT / "benchmarks" / "results" / name
    out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
