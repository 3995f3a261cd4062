"""Four prompts that arrive together, read in one llama_decode, in two of two, or in four of one:
what each plan costs in all and what it gives the clients' TTFT p50, on the server's kind of
context (4 sequences, one KV cache each, the process's threadpool).

`run serve` reads prompts that come together in one pass (docs/serve.md, "Prompts that come
together are read in one pass"); llama-server reads what has arrived when its loop turns, which
on 2 cores is often two and then two. This measures the trade on the host it runs on: a prompt
pass over more rows is cheaper per token only where the matrix kernels gain from the wider batch.

    python benchmarks/bench_prompt_passes.py [--model ALIAS|GGUF] [--rounds N] [--threads N]

Each round reads the four prompts of bench_serve_batch.py (chat-templated as the server does,
38-45 tokens) under each plan in an order that alternates, the KV cache cleared before each
plan. TTFT here is when the pass that read a prompt ends (the first token's logits); p50 is the
mean of the 2nd and 3rd of four. Writes benchmarks/results/prompt_passes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PLANS = {"1x4": [[0, 1, 2, 3]], "2x2": [[0, 1], [2, 3]], "4x1": [[0], [1], [2], [3]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from bench_serve_batch import PROMPTS

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine
    from taskrun.pipelines.llm.llamacpp_native import kernel_note

    engine = LlamaCppEngine.load(resolve(args.model), "cpu", "auto")
    lib = engine.lib
    prompts = [engine.prompt_ids(p) for p in PROMPTS]
    p = lib.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 4 * 1024, 512, 512, 4
    p.kv_unified, p.no_perf = False, True
    p.n_threads = p.n_threads_batch = args.threads
    ctx = lib.llama_init_from_model(engine.native.model, p)
    batch = lib.llama_batch_init(512, 0, 4)
    rows: dict[str, list] = {k: [] for k in PLANS}
    for r in range(args.rounds):
        for plan in list(PLANS) if r % 2 == 0 else list(PLANS)[::-1]:
            lib.llama_memory_clear(lib.llama_get_memory(ctx), False)
            passes = [_read(lib, ctx, batch, [prompts[s] for s in group], group) for group in PLANS[plan]]
            ends = [sum(passes[: i + 1]) for i in range(len(passes))]
            per = 4 // len(passes)
            ttft = sorted(ends[i // per] for i in range(4))
            rows[plan].append(
                {
                    "passes_s": [round(x, 3) for x in passes],
                    "total_s": round(ends[-1], 3),
                    "ttft_p50_s": round((ttft[1] + ttft[2]) / 2, 3),
                }
            )
            print(r, plan, rows[plan][-1], flush=True)
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    summary = {}
    for plan, v in rows.items():
        summary[plan] = {
            "total_s_median": statistics.median(x["total_s"] for x in v),
            "ttft_p50_s_median": statistics.median(x["ttft_p50_s"] for x in v),
        }
    one = summary["1x4"]
    for s in summary.values():
        s["total_vs_1x4"] = round(s["total_s_median"] / one["total_s_median"], 3)
        s["ttft_p50_vs_1x4"] = round(s["ttft_p50_s_median"] / one["ttft_p50_s_median"], 3)
    result = {
        "model": args.model,
        "threads": args.threads,
        "prompt_tokens": [len(x) for x in prompts],
        "cpu": kernel_note(),
        "threadpool": os.environ.get("TASKRUN_LLAMA_THREADPOOL", "1") != "0",
        "summary": summary,
        "rounds": rows,
    }
    (ROOT / "benchmarks" / "results" / "prompt_passes.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def _read(lib, ctx, batch, prompts: list[list[int]], seqs: list[int]) -> float:
    """One llama_decode over ``prompts`` (sequence ``seqs[i]`` each), logits at each one's end → seconds."""
    from taskrun.pipelines.llm.llamacpp_pool import SHARED

    n = 0
    for ids, seq in zip(prompts, seqs, strict=True):
        for i, t in enumerate(ids):
            batch.token[n], batch.pos[n], batch.n_seq_id[n] = t, i, 1
            batch.seq_id[n][0], batch.logits[n] = seq, int(i == len(ids) - 1)
            n += 1
    batch.n_tokens = n
    t0 = time.perf_counter()
    with SHARED.on(lib, ctx):
        rc = lib.llama_decode(ctx, batch)
    if rc != 0:
        raise SystemExit(f"llama_decode returned {rc}")
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
