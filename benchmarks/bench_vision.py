"""classify and detect: taskrun against a plain torch loop on the same weights, images and process.

    python benchmarks/bench_vision.py [--n 32] [--rounds 3] [--threads N] [--quick]

Classification: EfficientNet-Lite0. The references are the loop a user writes from the model's
README (per image, open it with PIL, resize to 224, scale to [-1, 1], run the float32 model on a
batch of one) and ONNX Runtime float32 at batch 16 on the same weights with the same PIL
preprocessing (runner/bench/classify.py: ort_loop). taskrun runs the same files through its job
runner (run_job: inputs, checks, the cached model, results) at --batch-size 1 and 16 on its
default runtime (ONNX Runtime, two batches in flight, decoding on a pool), and on its torch
runtime (bf16 where the CPU has bf16 instructions, channels_last; and float32). A step table
gives each step's cost per image: decode, resize, scaling to [-1, 1], forward.
Rounds interleave the paths so a noisy neighbour hits them all; the median round of each counts.
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
from taskrun.runner.bench.classify import (  # noqa: E402 (after the offline setting above)
    export_reference_onnx,
    ort_loop,
    reference_loop,
    reference_model,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32, help="images per timed pass (the sample photos, repeated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="16 images, 1 round (a smoke run)")
    ap.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads for every path (default: torch's own choice)"
    )
    args = ap.parse_args()
    from taskrun.runner.bench.host import host

    facts = host(bandwidth=True)  # before the contenders warm the machine
    if args.quick:
        args.n, args.rounds = 16, 1

    from taskrun.pipelines.device import configure_threads

    configure_threads()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.vision.efficientnet import imagenet_labels
    from taskrun.runner.jobs import run_job
    from taskrun.tasks import get_task
    from taskrun.tasks.base import Input

    files = [PHOTOS[i % len(PHOTOS)] for i in range(args.n)]
    inputs = [Input(source=str(f), kind="image", path=str(f)) for f in files]
    card = resolve("efficientnet-lite0")
    classify, detect = get_task("classify"), get_task("detect")
    ref = reference_model(card.path)

    import tempfile

    import onnxruntime as ort

    tmp = tempfile.TemporaryDirectory(prefix="taskrun-bench-onnx-")
    ref_session = ort.InferenceSession(
        str(export_reference_onnx(card.path, Path(tmp.name) / "m.onnx")), providers=["CPUExecutionProvider"]
    )

    def taskrun(batch, dtype, runtime=None):
        opts = classify.Options(batch_size=batch, top_k=1)
        t = time.perf_counter()
        rec = run_job(classify, lambda: inputs, opts, model="efficientnet-lite0", dtype=dtype, runtime=runtime)
        return time.perf_counter() - t, rec

    def timed_call(fn):
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out

    paths = {
        "plain torch loop (float32, batch 1)": lambda: timed_call(lambda: reference_loop(ref, files)),
        "onnxruntime (float32, batch 16)": lambda: timed_call(lambda: ort_loop(ref_session, files)),
        "taskrun batch 1 (default)": lambda: taskrun(1, "auto"),
        "taskrun batch 16 (default)": lambda: taskrun(16, "auto"),
        "taskrun torch batch 16 (auto)": lambda: taskrun(16, "auto", "torch"),
        "taskrun torch batch 16 (float32)": lambda: taskrun(16, "float32", "torch"),
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
    rates = {k: args.n / sorted(v)[len(v) // 2] for k, v in times.items()}  # medians
    base = rates["plain torch loop (float32, batch 1)"]
    ort_rate = rates["onnxruntime (float32, batch 16)"]
    default = last["taskrun batch 16 (default)"]
    auto_dtype = f"{default.runtime} {default.dtype}"
    steps = step_costs(files, ref_session, args.rounds)

    # top-1 on each distinct photo: taskrun's default dtype against the float32 reference loop
    names = imagenet_labels()
    ref_top1 = reference_loop(ref, PHOTOS)
    rec = run_job(
        classify,
        lambda: [Input(source=str(f), kind="image", path=str(f)) for f in PHOTOS],
        classify.Options(top_k=1),
        model="efficientnet-lite0",
    )
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
        "benchmark": "vision",
        "host": facts,
        "classifier": card.name,
        "classifier_digest": card.digest,
        "images": args.n,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "taskrun_auto_dtype": auto_dtype,
        "images_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratio_vs_plain_loop": {k: round(v / base, 2) for k, v in rates.items()},
        "ratio_vs_onnxruntime": {k: round(v / ort_rate, 2) for k, v in rates.items()},
        "step_ms_per_image": steps,
        "round_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "top1": top1,
        "top1_unchanged": top1_same,
        "detect_job_latency_s": latency,
        "detect_pipeline_latency_s": latency_inside,
        "detect_faces": faces,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, shared with other jobs (noisy)",
        "command": "python " + " ".join(sys.argv),
    }
    print(f"{'classification path (median round)':<36}{'images/s':>10}{'× loop':>8}{'× ORT':>8}")
    for k, v in rates.items():
        print(f"{k:<36}{v:>10.1f}{v / base:>8.2f}{v / ort_rate:>8.2f}")
    print(f"{'step (one thread unless said)':<44}{'ms/image':>9}")
    for k, v in steps.items():
        print(f"{k:<44}{v:>9.2f}")
    print(f"auto dtype {auto_dtype}; top-1 unchanged vs float32 loop on {len(PHOTOS)} photos: {top1_same}")
    print(f"{'detection (mtcnn), s per image':<36}{'job':>10}{'pipeline':>10}  faces")
    for k, v in latency.items():
        print(f"{k:<36}{v:>10.3f}{latency_inside[k]:>10.3f}  {faces[k]}")
    out = ROOT / "benchmarks" / "results" / (f"vision-threads{args.threads}.json" if args.threads else "vision.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def step_costs(files, ref_session, rounds: int) -> dict:
    """Each step's cost per image (median of ``rounds``): PIL decode, PIL resize, numpy scaling to
    [-1, 1], the reference's forward (float32 NCHW) and taskrun's (uint8 NHWC, scaling in the graph;
    two batches at once, one thread each), both at batch 16."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.vision.efficientnet import resized
    from taskrun.pipelines.vision.efficientnet_ort import onnx_file, session
    from taskrun.tasks.image_files import load_image

    n = len(files)
    images = [load_image(f) for f in files]
    small = [resized(im, 224) for im in images]
    x32 = np.stack([(np.asarray(r, dtype=np.float32) / 127.5 - 1.0).transpose(2, 0, 1) for r in small])
    u8 = np.stack([np.asarray(r) for r in small])
    ours = session(onnx_file(resolve("efficientnet-lite0"), 224), 1)
    pool = ThreadPoolExecutor(2)

    def two_at_once():
        list(pool.map(lambda i: ours.run(None, {"pixels": u8[i : i + 16]}), range(0, n, 16)))

    steps = {
        "decode (taskrun load_image)": lambda: [load_image(f) for f in files],
        "resize 224 (PIL bilinear)": lambda: [resized(im, 224) for im in images],
        "scale to [-1, 1] + NCHW (numpy)": lambda: np.stack(
            [(np.asarray(r, dtype=np.float32) / 127.5 - 1.0).transpose(2, 0, 1) for r in small]
        ),
        "forward, onnxruntime reference (all threads)": lambda: [
            ref_session.run(None, {"input": x32[i : i + 16]}) for i in range(0, n, 16)
        ],
        "forward, taskrun (2 batches x 1 thread)": two_at_once,
    }
    out = {}
    for name, fn in steps.items():
        fn()
        ts = []
        for _ in range(max(3, rounds)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out[name] = round(sorted(ts)[len(ts) // 2] / n * 1e3, 2)
    pool.shutdown()
    return out


if __name__ == "__main__":
    main()
