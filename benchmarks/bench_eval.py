"""run eval's endpoint client against the openai SDK, on one `run serve` (smollm2-135m, loopback):
the same streamed requests, alternated, each side's client TTFT and total time. Ratios, not times:
the machine is shared. Target (issue 28): client total within 5% of the SDK's, TTFT within 20 ms.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_eval.py [--n 8] [--max-tokens 24]
    PYTHONPATH=. .venv/bin/python benchmarks/bench_eval.py --loop [--rounds 5] [--max-tokens 24]

The first times the client alone. ``--loop`` times the whole eval loop (samples/eval/cases.jsonl on
an ``openai:`` setup: run_eval with its checks and run-log rows, as `run eval` runs it) against
the same requests sent directly with the openai SDK, one case after another, rounds alternated;
target (issue 28): the eval loop's wall time ≤ 1.05× the direct requests'. It writes
benchmarks/results/eval_overhead.json.
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
    ap.add_argument("--loop", action="store_true", help="time the whole eval loop against direct requests")
    ap.add_argument("--rounds", type=int, default=5)
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
        if args.loop:
            loop(url, args)
            return
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


def loop(url: str, args) -> None:
    """The eval loop over the sample cases vs the same requests sent directly (see the docstring)."""
    import json
    import os
    import tempfile
    from pathlib import Path

    from taskrun.runner.eval.cases import load_cases
    from taskrun.runner.eval.run import run_eval
    from taskrun.runner.eval.setups import parse_setup
    from taskrun.runner.runlog.store import RunLog

    root = Path(__file__).resolve().parent.parent
    cases = load_cases(str(root / "samples" / "eval" / "cases.jsonl"))
    (setup,) = parse_setup(f"openai:{url}/v1#smollm2-135m@max_tokens={args.max_tokens},temperature=0")
    sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    log = RunLog(os.path.join(tempfile.mkdtemp(), "eval-runs.db"))

    def direct() -> float:
        t0 = time.perf_counter()
        for case in cases:
            for _ in sdk.chat.completions.create(
                model="smollm2-135m",
                messages=case.messages,
                max_tokens=args.max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            ):
                pass
        return time.perf_counter() - t0

    own: list[float] = []  # per eval round: its wall time less the requests' own (the loop's own cost)

    def evaluated() -> float:
        t0 = time.perf_counter()
        out = run_eval(cases, [setup], eval_id=f"bench-{time.time_ns()}", log=log)
        wall = time.perf_counter() - t0
        own.append(wall - sum(a.completion_s for tries in out[setup.name].values() for a in tries))
        return wall

    direct(), evaluated()  # warm-up: the server's prompt cache, both clients' connections
    rounds = []
    for i in range(args.rounds):  # alternated, the order flipped each round
        pair = (evaluated(), direct()) if i % 2 == 0 else tuple(reversed((direct(), evaluated())))
        rounds.append({"eval_s": round(pair[0], 4), "direct_s": round(pair[1], 4)})
    med = statistics.median
    ratio = med(r["eval_s"] for r in rounds) / med(r["direct_s"] for r in rounds)
    per_round = [round(r["eval_s"] / r["direct_s"], 3) for r in rounds]
    print(f"{len(cases)} cases x {args.rounds} rounds, max_tokens {args.max_tokens}, smollm2-135m on run serve")
    print(
        f"eval loop median {med(r['eval_s'] for r in rounds):.3f} s, direct {med(r['direct_s'] for r in rounds):.3f} s"
    )
    print(f"  ratio {ratio:.3f} (target <= 1.05); per round {per_round}")
    loop_own = med(own[1:])  # the warm-up round left out
    share = loop_own / med(r["eval_s"] for r in rounds)
    print(
        f"the loop's own time (checks, run-log rows, threads) outside the requests: {loop_own * 1000:.1f} ms a round,"
    )
    print(f"  {loop_own / len(cases) * 1000:.2f} ms a case, {share:.2%} of the loop (noise-free: same-round clocks)")
    out = {
        "command": f"PYTHONPATH=. .venv/bin/python benchmarks/bench_eval.py --loop --rounds {args.rounds} "
        f"--max-tokens {args.max_tokens}",
        "cases": len(cases),
        "rounds": rounds,
        "ratio_median": round(ratio, 4),
        "per_round": per_round,
        "loop_own_s_median": round(loop_own, 5),
        "loop_own_share": round(share, 5),
        "load": os.getloadavg(),
    }
    (root / "benchmarks" / "results" / "eval_overhead.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
