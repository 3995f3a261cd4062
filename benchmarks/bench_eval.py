"""run eval's endpoint client against the openai SDK, on one `run serve` (smollm2-135m, loopback):
the same streamed requests, alternated, each side's client TTFT and total time. Ratios, not times:
the machine is shared. Target (issue 28): client total within 5% of the SDK's, TTFT within 20 ms.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_eval.py [--n 8] [--max-tokens 24]

It times the client alone: the eval loop and its run-log rows around it are not measured here yet.
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai

from taskrun.pipelines.llm.endpoint_client import Endpoint
from tests.serve_helpers import RUN, free_port


def main() -> None:
    import os
    import subprocess
    import tempfile

    import httpx

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TASKRUN_LOG_DB": os.path.join(tempfile.mkdtemp(), "runs.db")}
    server = subprocess.Popen(
        [RUN, "serve", "--port", str(port), "--preload", "smollm2-135m"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        msgs = [{"role": "user", "content": "Name three colours."}]
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        ep = Endpoint("openai", url + "/v1", "smollm2-135m")
        ours, theirs = [], []
        for i in range(args.n + 1):  # the first pair warms both up and is left out
            r = ep.chat(msgs, max_tokens=args.max_tokens, temperature=0)
            t0, first = time.perf_counter(), None
            for chunk in sdk.chat.completions.create(
                model="smollm2-135m", messages=msgs, max_tokens=args.max_tokens, temperature=0, stream=True
            ):
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - t0
            if i:
                ours.append((r.ttft_s, r.total_s))
                theirs.append((first, time.perf_counter() - t0))
        med = statistics.median
        o_ttft, t_ttft = med(x[0] for x in ours), med(x[0] for x in theirs)
        o_tot, t_tot = med(x[1] for x in ours), med(x[1] for x in theirs)
        print(f"requests {args.n} each, max_tokens {args.max_tokens}, smollm2-135m on run serve (loopback)")
        print(f"client TTFT median: endpoint client {o_ttft * 1000:.1f} ms, openai SDK {t_ttft * 1000:.1f} ms")
        print(f"  difference {(o_ttft - t_ttft) * 1000:+.1f} ms (target within 20 ms)")
        print(f"total median: endpoint client {o_tot:.3f} s, openai SDK {t_tot:.3f} s")
        print(f"  ratio {o_tot / t_tot:.3f} (target <= 1.05)")
    finally:
        server.terminate()
        server.wait(timeout=15)


if __name__ == "__main__":
    main()
