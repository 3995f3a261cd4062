"""Pixel-space UNet2DModel folders (DDPM/DDIM, such as digits-ddpm) through a short loop of our
own: diffusers has no pipeline for a class-conditional UNet, and this loop batches the
conditional and unconditional passes of classifier-free guidance into one forward."""

from __future__ import annotations

import inspect
import time

from taskrun.pipelines.diffusion.common import threads_for, to_pixels
from taskrun.pipelines.diffusion.tracing import torch, unet2d_denoiser
from taskrun.tasks import events as ev
from taskrun.tasks.clock import timed
from taskrun.tasks.image import Generation


def run_unet(pipe, cond, device: str, gen: Generation, scheduler, clock):
    """One Step per denoising step; returns (encode_s, loop_s, decode_s, steps, compile_s)."""
    n, cfg = len(gen.images), cond.cfg and (gen.guidance or 0) != 1
    t0 = time.perf_counter()
    with clock.scope("encode"):
        labels, x, extra = _start(pipe.unet, cond, device, gen, scheduler, cfg)
        x_in = scheduler.scale_model_input(torch.cat([x, x]) if cfg else x, scheduler.timesteps[0])
    with clock.scope("compile"):
        denoise, compile_s = unet2d_denoiser(pipe, x_in, scheduler.timesteps[0], labels)
    t1 = time.perf_counter()
    steps = _steps(denoise, scheduler, x, labels, extra, cfg, gen.guidance, t1)
    with threads_for(device, gen, 2 * n if cfg else n):
        x = yield from timed(steps, lambda s: clock.add("denoise", s))
    t2 = time.perf_counter()
    with clock.scope("decode"):
        to_pixels(gen, (x.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy())
    t3 = time.perf_counter()
    return t1 - t0 - compile_s, t2 - t1, t3 - t2, len(scheduler.timesteps), compile_s


def _start(unet, cond, device: str, gen: Generation, scheduler, cfg: bool):
    """(class labels or None, the starting noise, the scheduler's step arguments), each image's
    noise from its own seed."""
    n, labels = len(gen.images), None
    if gen.label is not None:
        idx = cond.label_index(gen.label)
        labels = torch.full((n,), idx, dtype=torch.long, device=device)
        if cfg:  # one batch: the conditional half, then the "no class" half
            labels = torch.cat([labels, torch.full_like(labels, cond.null_class)])
    shape = (1, unet.config.in_channels, gen.height, gen.width)
    noise = torch.cat([torch.randn(shape, generator=torch.Generator().manual_seed(im.seed)) for im in gen.images]).to(
        device, unet.dtype
    )
    scheduler.set_timesteps(gen.steps, device=device)
    step_gen = torch.Generator(device=device).manual_seed(gen.images[0].seed)
    # Stochastic samplers take the generator; deterministic ones (LMS, PNDM) have no such argument.
    extra = {"generator": step_gen} if "generator" in inspect.signature(scheduler.step).parameters else {}
    return labels, noise * scheduler.init_noise_sigma, extra


def _steps(denoise, scheduler, x, labels, extra: dict, cfg: bool, guidance, start: float):
    """The denoising loop: a Step event as each step ends (timed from ``start``); returns the
    final sample. With ``cfg`` each forward runs the conditional and the unconditional half."""
    total = len(scheduler.timesteps)  # Heun runs two model calls per step: count what runs
    last = start
    for i, t in enumerate(scheduler.timesteps):
        inp = scheduler.scale_model_input(torch.cat([x, x]) if cfg else x, t)
        out = denoise(inp, t, labels)
        if cfg:
            cond, uncond = out.chunk(2)
            out = uncond + guidance * (cond - uncond)
        x = scheduler.step(out, t, x, **extra).prev_sample
        now = time.perf_counter()
        yield ev.Step(i + 1, total, now - last)
        last = now
    return x
