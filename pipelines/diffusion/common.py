"""What both denoising paths share: loading a diffusers folder, schedulers, the thread count for
small work, and the images' pixels out."""

from __future__ import annotations

import contextlib
from typing import Any

from taskrun.pipelines.device import decode_threads
from taskrun.tasks.image import Generation

SCHEDULER_CLASSES = {
    "ddim": "DDIMScheduler",
    "ddpm": "DDPMScheduler",
    "euler": "EulerDiscreteScheduler",
    "euler-a": "EulerAncestralDiscreteScheduler",
    "dpm++": "DPMSolverMultistepScheduler",
    "pndm": "PNDMScheduler",
    "lms": "LMSDiscreteScheduler",
    "heun": "HeunDiscreteScheduler",
    "unipc": "UniPCMultistepScheduler",
}

# A denoising step on small images is many small ops: one thread beats two that wake each other
# (digits-ddpm, 10 images: 0.013 s/step on one thread, 0.021 on two). Large images keep them all.
SMALL_WORK_PIXELS = 64 * 64 * 2


def make_scheduler(name: str, current):
    """The scheduler ``name`` built from the model's own scheduler config (same noise schedule)."""
    if name == "default":
        return current.__class__.from_config(current.config)
    import diffusers

    return getattr(diffusers, SCHEDULER_CLASSES[name]).from_config(current.config)


def load_diffusers(path: str, kind: str, torch_dtype):
    """The folder's diffusers pipeline: the text-to-image auto class for text models (falling
    back to DiffusionPipeline for a class it does not map), DiffusionPipeline otherwise."""
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as dlogging

    # taskrun draws its own progress on stderr; the library's component-loading bar is noise there.
    dlogging.disable_progress_bar()
    dlogging.set_verbosity_error()

    if kind == "text":
        from diffusers import AutoPipelineForText2Image

        try:
            pipe = AutoPipelineForText2Image.from_pretrained(path, dtype=torch_dtype)
        except (ValueError, KeyError):  # a pipeline class AutoPipeline does not map
            pipe = DiffusionPipeline.from_pretrained(path, dtype=torch_dtype)
    else:
        pipe = DiffusionPipeline.from_pretrained(path, dtype=torch_dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def ready_for_inference(pipe, device: str):
    """``pipe`` on ``device`` with no gradients anywhere, and its denoiser channels_last on GPUs."""
    import torch

    pipe = pipe.to(device)
    for part in pipe.components.values():
        if hasattr(part, "requires_grad_"):
            part.requires_grad_(False)
    denoiser = denoiser_of(pipe)
    if denoiser is not None and device != "cpu":  # faster convolutions on GPUs
        denoiser.to(memory_format=torch.channels_last)
    return pipe


def denoiser_of(pipe) -> Any:
    """The network the loop calls each step: a UNet, or a transformer (DiT-style models)."""
    return getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)


def threads_for(device: str, gen: Generation, batch: int):
    """One thread for a loop over small images (see SMALL_WORK_PIXELS); all of them otherwise."""
    if gen.width * gen.height * batch <= SMALL_WORK_PIXELS:
        return decode_threads(device)
    return contextlib.nullcontext()


def to_pixels(gen: Generation, arr) -> None:
    """Store each image's uint8 pixels from ``arr`` (images × height × width × channels in [0, 1])."""
    import numpy as np

    pixels = (arr * 255).round().astype(np.uint8)
    for im, px in zip(gen.images, pixels):
        im.pixels = px
