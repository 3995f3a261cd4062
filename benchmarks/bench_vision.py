"""classify and detect: taskrun against a plain torch loop on the same weights, images and process.

    python benchmarks/bench_vision.py [--n 32] [--rounds 3] [--threads N] [--quick]

Classification: EfficientNet-Lite0. The reference is the loop a user writes from the model's
README: per image, open it with PIL, resize to 224, scale to [-1, 1], run the float32 model on a
batch of one, softmax. taskrun runs the same files through its job runner (run_job: inputs,
checks, the cached model, results) at --batch-size 1 and 16, with its default dtype (bf16 where
the CPU has bf16 instructions, channels_last) and in float32 to separate batching from bf16.
Rounds interleave the paths so a noisy neighbour hits them all; the best round of each counts.
The top-1 class of every photo under taskrun's default dtype is compared with the reference's.

Detection: MTCNN faces per image (latency, best of the rounds). There is no runnable reference
(facenet-pytorch's own code needs torchvision), so only taskrun's numbers are given; the boxes
are checked against the one face facenet-pytorch finds on the astronaut photo.
MTCNN runs single-threaded inside taskrun whatever --threads says (see pipelines/vision/faces.py).
Writes benchmarks/results/vision.json (vision-threadsN.json with --threads N).
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
PHOTOS = sorted((ROOT / "samples" / "images").glob("*.jpg"))


# the plain loop, shared with `run bench classify`
from taskrun.runner.bench_suites import reference_loop, reference_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32, help="images per timed pass (the sample photos, repeated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="16 images, 1 round (a smoke run)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads for every path (default: torch's own choice)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.rounds = 16, 1

    from taskrun.pipelines.device import configure_threads
    configure_threads()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from taskrun.pipelines.vision.efficientnet import imagenet_labels
    from taskrun.models.resolve import resolve
    from taskrun.runner.jobs import run_job
    from taskrun.tasks import get_task
    from taskrun.tasks.base import Input

    files = [PHOTOS[i % len(PHOTOS)] for i in range(args.n)]
    inputs = [Input(source=str(f), kind="image", path=str(f)) for f in files]
    card = resolve("efficientnet-lite0")
    classify, detect = get_task("classify"), get_task("detect")
    ref = reference_model(card.path)

    def taskrun(batch, dtype):
        opts = classify.Options(batch_size=batch, top_k=1)
        t = time.perf_counter()
        rec = run_job(classify, lambda: inputs, opts, model="efficientnet-lite0", dtype=dtype)
        return time.perf_counter() - t, rec

    def plain():
        t = time.perf_counter()
        out = reference_loop(ref, files)
        return time.perf_counter() - t, out

    paths = {
        "plain torch loop (float32, batch 1)": plain,
        "taskrun batch 1 (auto)": lambda: taskrun(1, "auto"),
        "taskrun batch 16 (auto)": lambda: taskrun(16, "auto"),
        "taskrun batch 16 (float32)": lambda: taskrun(16, "float32"),
    }
    for fn in paths.values():  # load, cache and warm up every path before timing
        fn()
    times: dict[str, list[float]] = {k: [] for k in paths}
    last: dict[str, object] = {}
    for r in range(args.rounds):
        order = list(paths) if r % 2 == 0 else list(reversed(paths))
        for name in order:
            dt, out = paths[name]()
            times[name].append(dt)
            last[name] = out
    rates = {k: args.n / min(v) for k, v in times.items()}
    base = rates["plain torch loop (float32, batch 1)"]
    auto_dtype = last["taskrun batch 16 (auto)"].dtype

    # top-1 on each distinct photo: taskrun's default dtype against the float32 reference loop
    names = imagenet_labels()
    ref_top1 = reference_loop(ref, PHOTOS)
    rec = run_job(classify, lambda: [Input(source=str(f), kind="image", path=str(f)) for f in PHOTOS],
                  classify.Options(top_k=1), model="efficientnet-lite0")
    ours_top1 = [r.labels[0].label for r in rec.results]
    top1 = {f.name: {"reference": names[a], "taskrun": b} for f, a, b in zip(PHOTOS, ref_top1, ours_top1)}
    top1_same = all(v["reference"] == v["taskrun"] for v in top1.values())

    # detection latency per photo
    det_inputs = [Input(source=str(f), kind="image", path=str(f)) for f in PHOTOS]
    run_job(detect, lambda: det_inputs, detect.Options(), model="mtcnn")  # load + warm up
    per_image = {f.name: [] for f in PHOTOS}
    inside = {f.name: [] for f in PHOTOS}  # the pipeline's own latency_s: decode + detect, no job overhead
    faces = {}
    for _ in range(args.rounds):
        for f, inp in zip(PHOTOS, det_inputs):
            t = time.perf_counter()
            drec = run_job(detect, lambda inp=inp: [inp], detect.Options(), model="mtcnn")
            per_image[f.name].append(time.perf_counter() - t)
            inside[f.name].append(drec.metrics.latency_s)
            faces[f.name] = [[round(b.x0), round(b.y0), round(b.x1), round(b.y1)] for b in drec.results[0].boxes]
    latency = {k: round(min(v), 4) for k, v in per_image.items()}
    latency_inside = {k: round(min(v), 4) for k, v in inside.items()}

    result = {
        "benchmark": "vision", "classifier": card.name, "classifier_digest": card.digest,
        "images": args.n, "rounds": args.rounds, "threads": torch.get_num_threads(),
        "taskrun_auto_dtype": auto_dtype,
        "images_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratio_vs_plain_loop": {k: round(v / base, 2) for k, v in rates.items()},
        "round_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "top1": top1, "top1_unchanged": top1_same,
        "detect_job_latency_s": latency, "detect_pipeline_latency_s": latency_inside, "detect_faces": faces,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, shared with other jobs (noisy)",
        "command": "python " + " ".join(sys.argv),
    }
    print(f"{'classification path':<36}{'images/s':>10}{'× loop':>8}")
    for k, v in rates.items():
        print(f"{k:<36}{v:>10.1f}{v / base:>8.2f}")
    print(f"auto dtype {auto_dtype}; top-1 unchanged vs float32 loop on {len(PHOTOS)} photos: {top1_same}")
    print(f"{'detection (mtcnn), s per image':<36}{'job':>10}{'pipeline':>10}  faces")
    for k, v in latency.items():
        print(f"{k:<36}{v:>10.3f}{latency_inside[k]:>10.3f}  {faces[k]}")
    out = ROOT / "benchmarks" / "results" / (f"vision-threads{args.threads}.json" if args.threads else "vision.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
