"""Speculative decoding (pipelines/llm/speculative.py): Qwen2.5-Coder-1.5B alone against the same
model with Qwen2.5-Coder-0.5B drafting, a 256-token answer at temperature 0, interleaved rounds in
one process (both engines loaded once, the prompt read afresh each answer).

Reported: decode tok/s of each (output tokens after the first ÷ their time, the meaning
`decode_tokens_per_s` has everywhere), their ratio (median over rounds), the draft's acceptance
rate, whether the texts are identical (they must be: greedy speculation is the target's text token
for token), and what bounds the speed: one target step, one draft step, and a batched verify pass
of k + 1 tokens, each in ms, on the threads the engine picked.

    python benchmarks/bench_speculative.py [--target GGUF] [--draft GGUF] [--rounds N]
        [--tokens N] [--draft-tokens K]

--target/--draft take a models.toml alias or a GGUF path (default: the files joined by hand in
/tmp/qwen, see docs/language-models.md). Writes benchmarks/results/speculative.json. The machine
may be shared: read the ratio, not the rates.
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = (
    "Write a Python module for a small library system: a Book dataclass (title, author, year, isbn), "
    "a Library class that adds, removes and finds books by author or year, and checks ISBN-13 "
    "check digits. Include docstrings and a short usage example."
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="/tmp/qwen/1.5b.gguf")
    ap.add_argument("--draft", default="/tmp/qwen/0.5b.gguf")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--draft-tokens", type=int, default=0, help="0: adaptive (the default)")
    args = ap.parse_args()

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.decode import complete
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.pipelines.llm.speculative import load_draft
    from taskrun.tasks.clock import Clock

    target = LlamaCppEngine.load(resolve(args.target), "cpu", "auto")
    draft = load_draft(args.draft, target, explicit=True)
    ids = target.prompt_ids(PROMPT)
    plain = Sampling(max_tokens=args.tokens, temperature=0.0)
    spec = Sampling(max_tokens=args.tokens, temperature=0.0, draft=draft, draft_tokens=args.draft_tokens)
    rows: dict[str, list] = {"alone": [], "draft": []}
    texts: dict[str, str] = {}
    for r in range(args.rounds):
        for name, s in (("alone", plain), ("draft", spec)) if r % 2 == 0 else (("draft", spec), ("alone", plain)):
            target.native.clear()  # no prompt kept from the other side's answer
            draft.native.clear()
            out = complete(target, ids, s, Clock())
            rows[name].append(
                {
                    "decode_tokens_per_s": round(out.decode_tokens_per_s, 2),
                    "output_tokens": len(out.token_ids),
                    "draft_tokens": out.draft_tokens,
                    "accepted_draft_tokens": out.accepted_draft_tokens,
                }
            )
            texts[name] = out.text
            print(name, rows[name][-1], flush=True)
    rate = {k: statistics.median(x["decode_tokens_per_s"] for x in v) for k, v in rows.items()}
    proposed = sum(x["draft_tokens"] for x in rows["draft"])
    accepted = sum(x["accepted_draft_tokens"] for x in rows["draft"])
    result = {
        "target": args.target,
        "draft": args.draft,
        "tokens": args.tokens,
        "draft_tokens": args.draft_tokens or "adaptive",
        "rounds": rows,
        "decode_tokens_per_s": rate,
        "ratio": round(rate["draft"] / rate["alone"], 3),
        "acceptance": round(accepted / proposed, 3) if proposed else 0.0,
        "identical_text": texts["alone"] == texts["draft"],
        "step_ms": _steps(target, draft, ids),
    }
    out_path = ROOT / "benchmarks" / "results" / "speculative.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))


def _steps(target, draft, ids) -> dict:
    """ms of one target step, one draft step, and a verify pass over 2, 5 and 9 tokens."""
    from taskrun.pipelines.llm.speculative import eval_all

    out: dict = {}
    target.prefill(ids, room=32)
    draft.prefill(ids, room=32)
    with target.decoding(), draft.decoding():
        out["threads"] = {"target": target.native.n_threads, "draft": draft.native.n_threads}
        for name, e in (("target_step", target), ("draft_step", draft)):
            e.decode_step(100)
            t0 = time.perf_counter()
            for _ in range(8):
                e.decode_step(100)
            out[name] = round((time.perf_counter() - t0) / 8 * 1000, 1)
        for n in (2, 5, 9):
            base = target.native.pos
            t0 = time.perf_counter()
            eval_all(target, [100] * n)
            out[f"verify_{n}"] = round((time.perf_counter() - t0) * 1000, 1)
            target.native.keep(base)
    return out


if __name__ == "__main__":
    main()
