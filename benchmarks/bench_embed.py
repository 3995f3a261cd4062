"""embed: taskrun against sentence-transformers `encode` and ONNX Runtime float32, same model, same
sentences, same process; and the engine choices behind taskrun's default, measured one by one.

    python benchmarks/bench_embed.py [--n 2000] [--rounds 3] [--quick]
    python benchmarks/bench_embed.py --candidates [--n 2000] [--rounds 3]

The first form is `run bench embed` (runner/bench/embed.py: the same contenders, interleaved
rounds, medians) and writes benchmarks/results/embed.json. ``--candidates`` times each text-encoder
engine (transformers in its default dtype, onnxruntime float32) on the same length-sorted texts
with: batches of 32 and 64 texts, 64 texts capped at 1,024 and 2,048 padded tokens, and batches
padded to a multiple of 8 tokens; rounds alternate the settings, and each row gives the median and
the lowest cosine against the transformers float32 vectors. Writes benchmarks/results/embed_candidates.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from taskrun.runner.bench.embed import sentences  # noqa: E402  (shared with `run bench embed`)

SETTINGS = [
    ("batch 32", 32, None, 1),
    ("batch 64", 64, None, 1),
    ("batch 64, <= 1024 tokens", 64, 1024, 1),
    ("batch 64, <= 2048 tokens", 64, 2048, 1),
    ("batch 32, padded to x8", 32, None, 8),
]


def padded(multiple: int):
    """pad_rows with each batch's width rounded up to ``multiple`` tokens (masked out)."""
    import numpy as np

    from taskrun.pipelines.text.engine import pad_rows

    def pad_to(ids, pad):
        input_ids, mask = pad_rows(ids, pad)
        extra = (-input_ids.shape[1]) % multiple
        if extra:
            input_ids = np.pad(input_ids, ((0, 0), (0, extra)), constant_values=pad)
            mask = np.pad(mask, ((0, 0), (0, extra)))
        return input_ids, mask

    return pad_to if multiple > 1 else pad_rows


def candidates(n: int, rounds: int) -> dict:
    import numpy as np

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.device import configure_threads
    from taskrun.pipelines.text import encoder as enc
    from taskrun.pipelines.text import hf_encoder, ort_encoder
    from taskrun.pipelines.text.hf_encoder import HFTextEncoder
    from taskrun.pipelines.text.ort_encoder import OrtTextEncoder

    configure_threads()
    import torch

    torch.set_grad_enabled(False)
    texts, card = sentences(n), resolve("minilm")
    ref = enc.encode(HFTextEncoder(card, "cpu", "float32"), texts, 32).vectors
    engines = {
        "transformers (default dtype)": HFTextEncoder(card, "cpu", "auto"),
        "onnxruntime float32": OrtTextEncoder(card, "cpu", "auto"),
    }
    times: dict[tuple[str, str], list[float]] = {}
    cosine: dict[tuple[str, str], float] = {}
    for r in range(rounds + 1):  # round 0 warms up
        for ename, engine in engines.items():
            for sname, bs, tokens, multiple in SETTINGS if r % 2 else reversed(SETTINGS):
                engine.batch_tokens = tokens
                hf_encoder.pad_rows = ort_encoder.pad_rows = padded(multiple)
                t = time.perf_counter()
                vec = enc.encode(engine, texts, bs).vectors
                dt = time.perf_counter() - t
                if r:
                    times.setdefault((ename, sname), []).append(dt)
                    cosine[(ename, sname)] = float((vec * ref).sum(1).min())
    hf_encoder.pad_rows = ort_encoder.pad_rows = padded(1)
    rows = [
        {
            "engine": e,
            "setting": s,
            "dtype": engines[e].dtype,
            "median_s": round(statistics.median(ts), 3),
            "sentences_per_s": round(n / statistics.median(ts), 1),
            "runs_s": [round(x, 3) for x in ts],
            "min_cosine_vs_float32": round(cosine[(e, s)], 5),
        }
        for (e, s), ts in times.items()
    ]
    return {
        "benchmark": "embed candidates",
        "sentences": n,
        "rounds": rounds,
        "rows": rows,
        "tokens": int(sum(len(x) for x in engines["onnxruntime float32"].tokenize(texts))),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "command": "python " + " ".join(sys.argv),
        "numpy": np.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="300 sentences, 1 round (a smoke run)")
    ap.add_argument("--candidates", action="store_true", help="time the engine settings one by one")
    args = ap.parse_args()
    if args.quick:
        args.n, args.rounds = 300, 1
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    if args.candidates:
        result = candidates(args.n, args.rounds)
        for row in result["rows"]:
            print(
                f"{row['engine']:<30}{row['setting']:<28}{row['median_s']:>8.3f} s"
                f"{row['sentences_per_s']:>9.1f}/s  cos {row['min_cosine_vs_float32']}"
            )
        (out / "embed_candidates.json").write_text(json.dumps(result, indent=1) + "\n")
        return

    from taskrun.runner.commands.bench import bench, table

    data: tuple[str, ...] = ()
    if args.n not in (300, 2000):  # the suite's own sets: 300 (--quick) and 2,000 sentences
        data = (str(out / f".embed_{args.n}.txt"),)
        Path(data[0]).write_text("\n".join(sentences(args.n)) + "\n")
    result = bench("embed", rounds=args.rounds, data=data, quick=args.n == 300)
    result["command"] = "python " + " ".join(sys.argv)
    print(table(result))
    (out / "embed.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
