"""Do llama.cpp's two CPU kernel levels give the same answers? The quality side of the AVX-512
build (pipelines/llm/llamacpp_kernels.py): the same acceptance cases through `run eval`, greedy,
once on the portable library (TASKRUN_LLAMA_KERNELS=portable) and once on what taskrun chooses
here (auto: the AVX-512 build where the CPU has it), per model.

    python benchmarks/bench_kernel_answers.py [--cases samples/eval/cases.jsonl] \
        [--models smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b] [--max-tokens 48]

The kernels round differently (other SIMD widths, other summation order), so a near tie between two
tokens can go the other way and the answer part from there. Reported per model and level: accepted
cases, and which answers differ between the levels, with both texts. Writes
benchmarks/results/kernel_answers.json. Greedy decoding is deterministic per level, so one run each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = Path(sys.executable).with_name("run")


def answers(cases: Path, model: str, max_tokens: int, kernels: str) -> dict[str, dict]:
    setup = f"{model}@max_tokens={max_tokens},temperature=0"
    env = {x: v for x, v in os.environ.items() if x != "LLAMA_CPP_LIB_PATH"}
    log = Path(tempfile.mkdtemp(prefix="kernel-answers-")) / "runs.db"  # not the user's run log
    env |= {"TASKRUN_LLAMA_KERNELS": kernels, "HF_HUB_OFFLINE": "1", "TASKRUN_LOG_DB": str(log)}
    p = subprocess.run(
        [str(RUN), "eval", str(cases), "--setup", setup, "--json"], env=env, capture_output=True, text=True
    )
    if not p.stdout.strip():
        sys.exit(f"run eval ({model}, {kernels}) failed: {p.stderr.strip()[-500:]}")
    report = json.loads(p.stdout)
    return {case: tries[-1] for case, tries in report["cases"][setup].items()}


def compare(portable: dict[str, dict], auto: dict[str, dict]) -> dict:
    differ = {
        case: {
            "portable": portable[case]["text"],
            "auto": auto[case]["text"],
            "accepted": {"portable": portable[case]["accepted"], "auto": auto[case]["accepted"]},
        }
        for case in portable
        if portable[case]["text"] != auto[case]["text"]
    }
    return {
        "cases": len(portable),
        "accepted": {
            "portable": sum(x["accepted"] for x in portable.values()),
            "auto": sum(x["accepted"] for x in auto.values()),
        },
        "same_answers": len(portable) - len(differ),
        "differ": differ,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=Path, default=HERE.parent / "samples" / "eval" / "cases.jsonl")
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "kernel_answers.json")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent.parent))
    from taskrun.pipelines.llm.llamacpp_kernels import choose, cpu_flags, installed_lib, root
    from taskrun.runner.bench.host import host

    folder, why = choose(cpu_flags(), root(), installed_lib())
    result = {
        "command": "python " + " ".join(sys.argv),
        "auto_is": why,
        "max_tokens": args.max_tokens,
        "models": {},
        "host": host(),
    }
    if folder is None:
        print(f"auto is the portable library here ({why}): nothing to compare", file=sys.stderr)
    for model in args.models.split(","):
        got = {k: answers(args.cases, model, args.max_tokens, k) for k in ("portable", "auto")}
        row = result["models"][model] = compare(got["portable"], got["auto"])
        acc = row["accepted"]
        print(
            f"{model:22} accepted portable {acc['portable']}/{row['cases']}, auto {acc['auto']}/{row['cases']}; "
            f"same answers {row['same_answers']}/{row['cases']}"
        )
        for case, d in row["differ"].items():
            print(f"  {case}: portable {d['portable'][:60]!r} / auto {d['auto'][:60]!r}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
