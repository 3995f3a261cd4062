"""The single-stream engine (`run generate`, summarize, chat, ``--draft``) on ggml's per-call
threads (its default) against the process's persistent pool (pipelines/llm/llamacpp_pool.py,
``SHARED``; TASKRUN_LLAMA_THREADPOOL=all puts single-stream contexts on it): the same process, the
same loaded engines, the cases alternated round by round (the variable is read at each call).

Cases, each once with the pool and once without it per round:
  alone   the 1.5B default alone, ``--tokens`` at temperature 0 on a prompt not read before (the
          prompt cache cleared), so each answer reads its prompt: TTFT (prefill_s) and decode tok/s
  draft   the same with the 0.5B draft at a fixed length (``--fixed``, 3: it always drafts, so
          the target's and the draft's contexts alternate every round): decode tok/s, acceptance

Reported: medians over rounds of each, the ratio pool ÷ none per round and their median, the
spread, and whether the pooled texts equal the unpooled ones.

    python benchmarks/bench_threadpool.py [--rounds N] [--tokens N] [--fixed K]

Writes benchmarks/results/threadpool.json. The machine may be shared: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    "Explain in three sentences why the sky is blue, round number {i}.",
    "Write a short Python function that checks whether a year is a leap year (variant {i}).",
    "List four things a city council decides, and say why each matters (take {i}).",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--fixed", type=int, default=3)
    args = ap.parse_args()

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.decode import complete
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine
    from taskrun.pipelines.llm.llamacpp_native import kernel_note
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.pipelines.llm.speculative import load_draft
    from taskrun.tasks.clock import Clock

    target = LlamaCppEngine.load(resolve(args.target), "cpu", "auto")
    draft = load_draft(args.draft, target, explicit=True)
    complete(target, target.prompt_ids("Hi"), Sampling(max_tokens=4, temperature=0.0), Clock())  # warm-up
    rows: dict[str, list] = {}
    texts: dict[str, list] = {}
    for r in range(args.rounds):
        modes = ("pool", "none") if r % 2 == 0 else ("none", "pool")
        for case in ("alone", "draft"):
            ids = target.prompt_ids(PROMPTS[r % len(PROMPTS)].format(i=r))
            s = Sampling(max_tokens=args.tokens, temperature=0.0)
            if case == "draft":
                s = Sampling(max_tokens=args.tokens, temperature=0.0, draft=draft, draft_tokens=args.fixed)
            for mode in modes:
                os.environ["TASKRUN_LLAMA_THREADPOOL"] = "all" if mode == "pool" else "0"
                target.native.clear()  # the prompt is read afresh in each mode
                draft.native.clear()
                out = complete(target, ids, s, Clock())
                row = {
                    "round": r,
                    "prefill_s": round(out.prefill_s, 4),
                    "prompt_tokens": len(ids),
                    "decode_tokens_per_s": round(out.decode_tokens_per_s, 2),
                    "output_tokens": len(out.token_ids),
                    "draft_tokens": out.draft_tokens,
                    "accepted_draft_tokens": out.accepted_draft_tokens,
                    "load_average": round(os.getloadavg()[0], 2),
                }
                rows.setdefault(f"{case}_{mode}", []).append(row)
                texts.setdefault(f"{case}_{mode}", []).append(out.text)
                print(case, mode, row, flush=True)
    result = {
        "target": args.target,
        "draft": args.draft,
        "tokens": args.tokens,
        "fixed_draft_tokens": args.fixed,
        "cpu": kernel_note(),
        "summary": _summary(rows, texts),
        "rounds": rows,
    }
    out_path = ROOT / "benchmarks" / "results" / "threadpool.json"
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))


def _summary(rows: dict, texts: dict) -> dict:
    out: dict = {}
    for case in ("alone", "draft"):
        pool, none = rows[f"{case}_pool"], rows[f"{case}_none"]
        for key in ("prefill_s", "decode_tokens_per_s"):
            if case == "draft" and key == "prefill_s":
                continue
            ratios = [p[key] / n[key] for p, n in zip(pool, none, strict=True) if n[key]]
            out[f"{case}_{key}"] = {
                "pool_median": statistics.median(x[key] for x in pool),
                "none_median": statistics.median(x[key] for x in none),
                "pool_over_none_median": round(statistics.median(ratios), 3),
                "pool_over_none_range": [round(min(ratios), 3), round(max(ratios), 3)],
                "pool_range": [min(x[key] for x in pool), max(x[key] for x in pool)],
                "none_range": [min(x[key] for x in none), max(x[key] for x in none)],
            }
        proposed = sum(x["draft_tokens"] for x in pool + none)
        if proposed:
            out[f"{case}_acceptance"] = round(sum(x["accepted_draft_tokens"] for x in pool + none) / proposed, 3)
        out[f"{case}_identical_texts"] = texts[f"{case}_pool"] == texts[f"{case}_none"]
    return out


if __name__ == "__main__":
    main()
