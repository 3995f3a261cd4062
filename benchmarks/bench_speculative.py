"""Speculative decoding (pipelines/llm/speculative.py): Qwen2.5-Coder-1.5B alone against the same
model with Qwen2.5-Coder-0.5B drafting, a 256-token answer at temperature 0, interleaved rounds in
one process (both engines loaded once, the prompt read afresh each answer).

Three taskrun cases: the model alone; the draft at its default (adaptive length, and stopped for
the rest of the answer once its rounds are slower than the model's own steps: the pace); and a
fixed draft length (``--fixed K``, 3 by default), which always drafts: what speculation itself
costs or gains on this machine.

Reported: decode tok/s of each (output tokens after the first ÷ their time, the meaning
`decode_tokens_per_s` has everywhere), their ratios to the model alone (median over rounds), the
draft's acceptance rate, where the adaptive draft stopped, whether the texts are identical
(greedy speculation is the target's text, up to llama.cpp's batched kernels rounding a near tie
the other way: docs/language-models.md), and what bounds the speed: one target step, one draft
step, and a batched verify pass over 2, 4, 5, 8 and 9 tokens, each in ms, on the engine's threads.

With ``--llama-server PATH`` (built as benchmarks/llama_server.py says), the reference: the same
request (chat completion, 256 tokens, temperature 0) to a llama-server on the same GGUF alone and
to one given the same draft (``-md``, ``--spec-type draft-simple``, ``--spec-draft-n-max`` K), same
threads, in rounds alternating with taskrun's; its decode tok/s (``timings.predicted_per_second``)
and acceptance (``draft_n_accepted`` ÷ ``draft_n``).

    python benchmarks/bench_speculative.py [--target GGUF] [--draft GGUF] [--rounds N]
        [--tokens N] [--fixed K] [--llama-server PATH] [--threads N]

--target/--draft take a models.toml alias or a GGUF path (default: the packaged pair,
qwen2.5-coder-1.5b and qwen2.5-coder-0.5b). Writes benchmarks/results/speculative.json. The
machine may be shared: read the ratios, not the rates.
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
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--fixed", type=int, default=3, help="the fixed draft length of the third case")
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's server binary: the reference")
    ap.add_argument(
        "--threads", type=int, default=0, help="threads for both engines (0: taskrun picks, llama-server all cores)"
    )
    args = ap.parse_args()
    if args.threads:
        os.environ["TASKRUN_DECODE_THREADS"] = os.environ["TASKRUN_THREADS"] = str(args.threads)

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.decode import complete
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.pipelines.llm.speculative import load_draft
    from taskrun.tasks.clock import Clock

    target = LlamaCppEngine.load(resolve(args.target), "cpu", "auto")
    draft = load_draft(args.draft, target, explicit=True)
    ids = target.prompt_ids(PROMPT)
    cases = {
        "alone": Sampling(max_tokens=args.tokens, temperature=0.0),
        "adaptive": Sampling(max_tokens=args.tokens, temperature=0.0, draft=draft),
        f"fixed_{args.fixed}": Sampling(max_tokens=args.tokens, temperature=0.0, draft=draft, draft_tokens=args.fixed),
    }
    ref = _reference(args, target, draft) if args.llama_server else None
    rows: dict[str, list] = {name: [] for name in cases}
    texts: dict[str, str] = {}
    for r in range(args.rounds):
        order = list(cases) if r % 2 == 0 else list(cases)[::-1]
        if ref is not None:
            order = [*order, *ref.names] if r % 2 == 0 else [*ref.names[::-1], *order]
        for name in order:
            if ref is not None and name in ref.names:
                row, texts[name] = ref.answer(name, args.tokens)
            else:
                target.native.clear()  # no prompt kept from the other case's answer
                draft.native.clear()
                out = complete(target, ids, cases[name], Clock())
                row = {
                    "decode_tokens_per_s": round(out.decode_tokens_per_s, 2),
                    "output_tokens": len(out.token_ids),
                    "draft_tokens": out.draft_tokens,
                    "accepted_draft_tokens": out.accepted_draft_tokens,
                    "draft_stopped_at": out.draft_stopped_at,
                }
                texts[name] = out.text
            rows.setdefault(name, []).append(row)
            print(name, row, flush=True)
    if ref is not None:
        ref.stop()
    result = _summary(args, rows, texts, ref)
    result["step_ms"] = _steps(target, draft, ids)
    out_path = ROOT / "benchmarks" / "results" / "speculative.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))


def _summary(args, rows: dict, texts: dict, ref) -> dict:
    """Medians, ratios to each engine's model alone, acceptance and identical texts, per case."""
    rate = {k: statistics.median(x["decode_tokens_per_s"] for x in v) for k, v in rows.items()}
    cases: dict = {}
    for name, v in rows.items():
        alone = "llama_alone" if name.startswith("llama") else "alone"
        proposed = sum(x.get("draft_tokens", 0) for x in v)
        accepted = sum(x.get("accepted_draft_tokens", 0) for x in v)
        cases[name] = {
            "decode_tokens_per_s": rate[name],
            "ratio_to_alone": round(rate[name] / rate[alone], 3),
            "acceptance": round(accepted / proposed, 3) if proposed else None,
            "identical_text": texts[name] == texts[alone],
        }
        if "draft_stopped_at" in v[0]:
            cases[name]["draft_stopped_at"] = [x["draft_stopped_at"] for x in v]
    return {
        "target": args.target,
        "draft": args.draft,
        "tokens": args.tokens,
        "fixed_draft_tokens": args.fixed,
        "cpu": _cpu(),
        "llama_server": ref.info if ref is not None else "not measured (no --llama-server given)",
        "cases": cases,
        "rounds": rows,
    }


def _cpu() -> str:
    from taskrun.pipelines.llm.llamacpp_native import kernel_note

    return kernel_note()


class _Reference:
    """llama-server alone and with the draft, on the same files and threads (taskrun's engine's)."""

    names = ("llama_alone", "llama_draft")

    def __init__(self, binary: Path, target: Path, draft: Path, threads: int, fixed: int) -> None:
        import tempfile

        from llama_server import LlamaServer

        folder = Path(tempfile.mkdtemp(prefix="bench-speculative-"))
        spec = ("-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(fixed))
        spec += ("-td", str(threads), "-tbd", str(threads))
        self.servers = {
            "llama_alone": LlamaServer(binary, target, folder, 1, threads),
            "llama_draft": LlamaServer(binary, target, folder, 1, threads, spec, "-draft"),
        }
        for server in self.servers.values():
            server.wait()
        one = self.servers["llama_alone"]
        self.info = {"version": one.version(), "kernels": one.system_info(), "logs": str(folder), "threads": threads}

    def answer(self, name: str, tokens: int) -> tuple[dict, str]:
        import httpx

        body = {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "temperature": 0,
            "cache_prompt": False,
        }
        r = httpx.post(self.servers[name].url + "/v1/chat/completions", json=body, timeout=900).json()
        t = r["timings"]
        row = {
            "decode_tokens_per_s": round(t["predicted_per_second"], 2),
            "output_tokens": t["predicted_n"],
            "draft_tokens": t.get("draft_n", 0),
            "accepted_draft_tokens": t.get("draft_n_accepted", 0),
        }
        return row, r["choices"][0]["message"]["content"]

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def _reference(args, target, draft) -> _Reference:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return _Reference(args.llama_server, target.path, draft.path, args.threads or os.cpu_count() or 2, args.fixed)


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
        for n in (2, 4, 5, 8, 9):  # the best of 3: one pass each is at the mercy of a neighbour
            base, best = target.native.pos, float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                eval_all(target, [100] * n)
                best = min(best, time.perf_counter() - t0)
                target.native.keep(base)
            out[f"verify_{n}"] = round(best * 1000, 1)
    return out


if __name__ == "__main__":
    main()
