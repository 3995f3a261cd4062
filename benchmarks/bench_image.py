"""image: taskrun's diffusers pipeline against the plain library on the same model, seed and inputs.

Two models, measured in one process with the runs interleaved:
- digits-ddpm (the offline default, a class-conditional UNet2DModel): taskrun's loop against the
  loop diffusers' tutorials write (one batched forward for the conditional and unconditional
  halves, eager UNet), and against a naive loop with two forwards per step.
- a tiny random Stable Diffusion pipeline built in code (tests/tiny/sd.py): taskrun's path against
  a plain ``pipe(prompt)`` call with default settings (50 steps, guidance 7.5).

s_per_step is the denoising loop only (first denoiser call to the last step), images_per_s is
images ÷ (encode + loop + decode). Pixels are compared (max absolute difference, 0-255).

    python benchmarks/bench_image.py [--quick]      → benchmarks/results/image.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from taskrun.pipelines.device import configure_threads  # noqa: E402

configure_threads()
import numpy as np  # noqa: E402
import torch  # noqa: E402

from taskrun.tasks import events as ev  # noqa: E402
from taskrun.tasks.base import Input  # noqa: E402
from taskrun.tasks.clock import Clock  # noqa: E402
from taskrun.tasks.image import Options  # noqa: E402


def taskrun_job(pipe, inputs, **opts):
    with torch.inference_mode():
        events = list(pipe.run(inputs, Options(**opts), Clock()))
    gen = [e for e in events if isinstance(e, ev.Item)][0].result
    m = events[-1].metrics
    return {
        "s_per_step": m.s_per_step,
        "images_per_s": m.images_per_s,
        "compile_s": m.compile_s,
        "pixels": np.stack([im.pixels for im in gen.images]),
    }


# --------------------------------------------------------------------------- digits


def digits_reference(folder: Path, label: int, n: int, steps: int, guidance: float, seed: int, batched: bool = True):
    """The loop a diffusers user writes for a class-conditional UNet2DModel (eager, fp32)."""
    from diffusers import DDIMScheduler, UNet2DModel

    unet = _cache.setdefault("unet", UNet2DModel.from_pretrained(folder / "unet").eval())
    sched = DDIMScheduler.from_pretrained(folder / "scheduler")
    null = json.loads((folder / "conditioning.json").read_text())["null_class"]
    with torch.inference_mode():
        t0 = time.perf_counter()
        x = torch.cat([torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(seed + i)) for i in range(n)])
        sched.set_timesteps(steps)
        y, y0 = torch.full((n,), label), torch.full((n,), null)
        t1 = time.perf_counter()
        for t in sched.timesteps:
            if batched:
                cond, uncond = unet(torch.cat([x, x]), t, class_labels=torch.cat([y, y0])).sample.chunk(2)
            else:
                cond = unet(x, t, class_labels=y).sample
                uncond = unet(x, t, class_labels=y0).sample
            x = sched.step(uncond + guidance * (cond - uncond), t, x).prev_sample
        t2 = time.perf_counter()
        pixels = ((x / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
        t3 = time.perf_counter()
    return {"s_per_step": (t2 - t1) / steps, "images_per_s": n / (t3 - t0), "pixels": pixels}


_cache: dict = {}


def bench_digits(rounds: int, steps: int = 25, n: int = 10, label: int = 7, seed: int = 42):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.diffusion.image import DiffusionPipeline as Pipeline

    card = resolve("digits-ddpm")
    folder = Path(card.path)
    guidance = json.loads((folder / "conditioning.json").read_text())["default_guidance"]
    pipe = Pipeline(card, device="cpu")
    runs = {"taskrun": [], "reference": [], "naive": []}
    for _r in range(rounds):  # interleaved, so a busy moment on the machine hits all three
        runs["taskrun"].append(taskrun_job(pipe, [], label=str(label), n=n, steps=steps, seed=seed))
        runs["reference"].append(digits_reference(folder, label, n, steps, guidance, seed))
        runs["naive"].append(digits_reference(folder, label, n, steps, guidance, seed, batched=False))
    bf16 = Pipeline(card, device="cpu", dtype="bfloat16")
    bf = [taskrun_job(bf16, [], label=str(label), n=n, steps=steps, seed=seed) for _ in range(3)]
    steady = runs["taskrun"][2:] or runs["taskrun"]  # job 1 runs eager, job 2 traces the UNet
    out = summarize(steady, runs["reference"], runs["naive"])
    out.update(
        model="digits-ddpm",
        setting=f"label {label}, n={n}, {steps} DDIM steps, guidance {guidance}, cpu fp32",
        first_job_s_per_step=runs["taskrun"][0]["s_per_step"],
        trace_once_s=max(x["compile_s"] for x in runs["taskrun"]),
        bf16_s_per_step=med(bf[1:], "s_per_step"),
        bf16_max_pixel_diff=int(np.abs(bf[-1]["pixels"].astype(int) - runs["reference"][0]["pixels"]).max()),
    )
    return out


# --------------------------------------------------------------------------- tiny SD


def sd_reference(pipe, prompt: str, seed: int):
    """A plain diffusers call with default settings; the same hooks time its loop."""
    marks = {}

    def first_forward(module, args):  # returns None: a pre-hook's return value would replace args
        marks.setdefault("loop", time.perf_counter())

    hook = pipe.unet.register_forward_pre_hook(first_forward)

    def on_step(p, i, t, kw):
        marks["last"] = time.perf_counter()
        return {}

    try:
        t0 = time.perf_counter()
        out = pipe(
            prompt, generator=torch.Generator().manual_seed(seed), output_type="np", callback_on_step_end=on_step
        )
        t3 = time.perf_counter()
    finally:
        hook.remove()
    steps = pipe.num_timesteps
    return {
        "s_per_step": (marks["last"] - marks["loop"]) / steps,
        "images_per_s": 1 / (t3 - t0),
        "pixels": (out.images * 255).round().astype(np.uint8),
    }


def bench_sd(rounds: int, seed: int = 42):
    from diffusers import StableDiffusionPipeline

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.diffusion.image import DiffusionPipeline as Pipeline
    from tests.tiny.sd import build

    folder = build(Path(tempfile.mkdtemp(prefix="bench-image-")))
    ours = Pipeline(resolve(str(folder)), device="cpu")
    ref = StableDiffusionPipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    prompt = [Input(source="bench", kind="text", text="a red fox")]
    runs = {"taskrun": [], "reference": []}
    for _r in range(rounds):
        runs["taskrun"].append(taskrun_job(ours, prompt, seed=seed))
        with torch.inference_mode():
            runs["reference"].append(sd_reference(ref, "a red fox", seed))
    steady = runs["taskrun"][2:] or runs["taskrun"]  # job 1 runs eager, job 2 traces the UNet
    out = summarize(steady, runs["reference"], None)
    out.update(
        first_job_s_per_step=runs["taskrun"][0]["s_per_step"],
        trace_once_s=max(x["compile_s"] for x in runs["taskrun"]),
        model="tiny random Stable Diffusion (tests/tiny/sd.py)",
        setting="defaults: 50 DDIM steps, guidance 7.5, 32x32, cpu fp32",
    )
    return out


# --------------------------------------------------------------------------- report


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def summarize(ours, ref, naive):
    out = {
        "taskrun_s_per_step": med(ours, "s_per_step"),
        "reference_s_per_step": med(ref, "s_per_step"),
        "taskrun_images_per_s": med(ours, "images_per_s"),
        "reference_images_per_s": med(ref, "images_per_s"),
        "max_pixel_diff": int(np.abs(ours[-1]["pixels"].astype(int) - ref[-1]["pixels"]).max()),
    }
    out["per_step_speedup"] = out["reference_s_per_step"] / out["taskrun_s_per_step"]
    out["images_per_s_ratio"] = out["taskrun_images_per_s"] / out["reference_images_per_s"]
    if naive:
        out["naive_two_pass_s_per_step"] = med(naive, "s_per_step")
        out["per_step_speedup_vs_naive"] = out["naive_two_pass_s_per_step"] / out["taskrun_s_per_step"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    a = ap.parse_args()
    from taskrun.runner.bench.host import host

    facts = host(bandwidth=True)  # before the contenders warm the machine
    rounds = 4 if a.quick else 8
    results = {
        "digits": bench_digits(rounds),
        "tiny_sd": bench_sd(4 if a.quick else 6),
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "host": facts,
        "note": "2 shared CPU cores, busy with other jobs: compare ratios from the same run, not absolute numbers",
    }
    print(
        f"{'model':<10} {'taskrun s/step':>15} {'reference s/step':>17} {'speedup':>8} "
        f"{'taskrun img/s':>14} {'ref img/s':>10} {'max px diff':>12}"
    )
    for name in ("digits", "tiny_sd"):
        r = results[name]
        print(
            f"{name:<10} {r['taskrun_s_per_step']:>15.4f} {r['reference_s_per_step']:>17.4f} "
            f"{r['per_step_speedup']:>7.2f}x {r['taskrun_images_per_s']:>14.2f} "
            f"{r['reference_images_per_s']:>10.2f} {r['max_pixel_diff']:>12}"
        )
    for name in ("digits", "tiny_sd"):
        r = results[name]
        print(
            f"{name}: first (untraced) job {r['first_job_s_per_step']:.4f} s/step; "
            f"tracing the UNet once {r['trace_once_s']:.2f} s"
        )
    d = results["digits"]
    print(
        f"digits: vs a naive two-forward CFG loop {d['per_step_speedup_vs_naive']:.2f}x per step; "
        f"bf16 {d['bf16_s_per_step']:.4f} s/step (max px diff {d['bf16_max_pixel_diff']})"
    )
    out = ROOT / "benchmarks" / "results" / "image.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
