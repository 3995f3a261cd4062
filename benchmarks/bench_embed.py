"""embed: taskrun vs sentence-transformers `encode` on the same model, same sentences, same process.

    python benchmarks/bench_embed.py [--n 2000] [--rounds 2] [--quick]

Rounds alternate the two (ST, taskrun, ST, taskrun, ...) so a noisy neighbour hits both; the best
round of each is compared. Reports sentences/s, the ratio, and the minimum cosine similarity
between the two outputs (taskrun's default dtype against sentence-transformers' float32).
Writes benchmarks/results/embed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


from taskrun.runner.bench_suites import sentences  # noqa: E402  (shared with `run bench embed`)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="300 sentences, 1 round (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.rounds = 300, 1

    from taskrun.pipelines.device import configure_threads
    configure_threads()
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from taskrun.models.resolve import resolve
    from taskrun.runner.jobs import run_job
    from taskrun.tasks import get_task
    from taskrun.tasks.base import Input

    texts = sentences(args.n)
    card = resolve("minilm")
    st = SentenceTransformer(card.path, device="cpu")
    task = get_task("embed")
    opts = task.Options()
    inputs = [Input(source=f"s{i}", kind="text", text=t) for i, t in enumerate(texts)]

    def run_st():
        t = time.perf_counter()
        with torch.inference_mode():
            v = st.encode(texts, batch_size=32, normalize_embeddings=True)  # ST's default batch size
        return time.perf_counter() - t, v

    def run_taskrun():
        t = time.perf_counter()
        rec = run_job(task, lambda: inputs, opts, model="minilm")
        dt = time.perf_counter() - t
        return dt, np.stack([r.vector for r in rec.results]), rec

    run_taskrun()  # load + warm up both before timing
    st.encode(texts[:64])
    st_times, tr_times = [], []
    for _ in range(args.rounds):
        dt, v_st = run_st()
        st_times.append(dt)
        dt, v_tr, rec = run_taskrun()
        tr_times.append(dt)
    cos = (v_st * v_tr).sum(1) / (np.linalg.norm(v_st, axis=1) * np.linalg.norm(v_tr, axis=1))
    st_rate, tr_rate = args.n / min(st_times), args.n / min(tr_times)
    result = {
        "benchmark": "embed", "model": card.name, "digest": card.digest, "sentences": args.n,
        "rounds": args.rounds, "taskrun_dtype": rec.dtype, "threads": torch.get_num_threads(),
        "sentence_transformers_per_s": round(st_rate, 1), "taskrun_per_s": round(tr_rate, 1),
        "ratio": round(tr_rate / st_rate, 2), "min_cosine": round(float(cos.min()), 5),
        "st_round_s": [round(x, 3) for x in st_times], "taskrun_round_s": [round(x, 3) for x in tr_times],
        "machine": f"{platform.machine()} {os.cpu_count()} cpus", "command": "python " + " ".join(sys.argv),
    }
    print(f"{'path':<32}{'sentences/s':>12}")
    print(f"{'sentence-transformers encode':<32}{st_rate:>12.1f}")
    print(f"{'taskrun embed (' + rec.dtype + ')':<32}{tr_rate:>12.1f}")
    print(f"ratio {result['ratio']}x   min cosine {result['min_cosine']}   ({args.n} sentences, best of {args.rounds})")
    out = ROOT / "benchmarks" / "results" / "embed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
