"""image on diffusers: text-to-image pipelines, and class-conditional / unconditional UNets.

Text-to-image models run through the library's own pipeline call (text2image.py); pixel-space
UNet2DModel models (DDPM/DDIM folders such as digits-ddpm) through a short loop of our own
(unet_loop.py). Both trace the UNet from the second job of a shape on (tracing.py).
"""

from __future__ import annotations

import random

from taskrun.pipelines import cached_model
from taskrun.pipelines.base import Pipeline as Base
from taskrun.pipelines.device import configure_threads, resolve_dtype

configure_threads()  # before torch starts its thread pool (passive OpenMP waits on shared cores)
from taskrun.pipelines.diffusion.common import load_diffusers, make_scheduler, ready_for_inference  # noqa: E402
from taskrun.pipelines.diffusion.text2image import run_text  # noqa: E402
from taskrun.pipelines.diffusion.unet_loop import run_unet  # noqa: E402
from taskrun.tasks import events as ev  # noqa: E402
from taskrun.tasks.base import TaskError  # noqa: E402
from taskrun.tasks.image import Generation, Image, Metrics, check_request, parse_size  # noqa: E402
from taskrun.tasks.image_conditioning import read_conditioning  # noqa: E402


class DiffusionPipeline(Base):
    task = "image"
    runtime = "diffusers"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        self.cond = read_conditioning(card.path)
        # Half precision on GPUs; float32 on CPU, where bf16 measured slower on these small models
        # (benchmarks/bench_image.py) and --dtype bfloat16 stays available.
        auto = "float16" if self.device.startswith("cuda") else "float32"
        torch_dtype, self.dtype = resolve_dtype(dtype, self.device, auto)
        self.pipe = cached_model(
            card,
            self.runtime,
            self.device,
            self.dtype,
            "pipeline",
            lambda: ready_for_inference(load_diffusers(self.card.path, self.cond.kind, torch_dtype), self.device),
        )

    def settings(self, inputs, options):
        """(the Generation this job will make, with every setting resolved, and its scheduler)."""
        prompt = inputs[0].text if inputs else None
        label = check_request(self.cond, self.card.name, prompt, options)
        steps = options.steps or self.cond.default_steps
        guidance = options.guidance if options.guidance is not None else self.cond.default_guidance
        w, h = parse_size(options.size) if options.size else self.cond.native
        seed = options.seed if options.seed is not None else random.randrange(2**31)
        scheduler = make_scheduler(options.scheduler, self.pipe.scheduler)
        gen = Generation(
            prompt=prompt,
            label=label,
            negative=options.negative,
            steps=steps,
            scheduler=scheduler.__class__.__name__,
            guidance=guidance,
            width=w,
            height=h,
            model=self.card.name,
            model_digest=self.card.digest,
            images=[Image(seed=seed + i) for i in range(options.n)],
        )
        return gen, scheduler

    def run(self, inputs, options, clock):
        gen, scheduler = self.settings(inputs, options)
        if self.cond.kind == "text":
            timing = yield from run_text(self.pipe, self.device, gen, scheduler, clock)
        elif hasattr(self.pipe, "unet") and self.pipe.unet.__class__.__name__ == "UNet2DModel":
            timing = yield from run_unet(self.pipe, self.cond, self.device, gen, scheduler, clock)
        else:
            raise TaskError(
                f"`{self.card.name}` is a {self.card.architecture}; taskrun runs "
                f"text-to-image pipelines and pixel-space UNet2DModel folders"
            )
        yield ev.Item(0, gen.prompt or (f"label {gen.label}" if gen.label else "unconditional"), gen)
        yield ev.Done(_metrics(gen, *timing))


def _metrics(
    gen: Generation, encode_s: float, loop_s: float, decode_s: float, n_steps: int, compile_s: float
) -> Metrics:
    total = encode_s + loop_s + decode_s
    return Metrics(
        images=len(gen.images),
        steps=n_steps,
        s_per_step=loop_s / max(n_steps, 1),
        encode_s=encode_s,
        decode_s=decode_s,
        images_per_s=len(gen.images) / total if total > 0 else 0.0,
        compile_s=compile_s,
        width=gen.width,
        height=gen.height,
    )
