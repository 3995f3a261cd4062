"""image on diffusers: text-to-image pipelines, and class-conditional / unconditional UNets.

Text-to-image models run through the library's own pipeline call (AutoPipelineForText2Image,
falling back to DiffusionPipeline), with one ``Step`` event per denoising step from
``callback_on_step_end``. The call runs in a worker thread so steps reach the progress bar as
they happen; the queue has a timeout and the worker's exception is re-raised here.

Pixel-space UNet2DModel models (DDPM/DDIM folders such as digits-ddpm) run through a short loop
of our own: diffusers has no pipeline for a class-conditional UNet, and the loop batches the
conditional and unconditional passes of classifier-free guidance into one forward.
"""

from __future__ import annotations

import contextlib

import inspect
import queue
import random
import threading
import time
import warnings

from taskrun.pipelines import cached_model
from taskrun.pipelines.base import Pipeline as Base
from taskrun.pipelines.device import configure_threads, decode_threads, resolve_dtype

configure_threads()  # before torch starts its thread pool (passive OpenMP waits on shared cores)
import torch  # noqa: E402
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.image import Generation, Image, Metrics, check_request, parse_size
from taskrun.tasks.image_conditioning import read_conditioning

SCHEDULER_CLASSES = {
    "ddim": "DDIMScheduler", "ddpm": "DDPMScheduler", "euler": "EulerDiscreteScheduler",
    "euler-a": "EulerAncestralDiscreteScheduler", "dpm++": "DPMSolverMultistepScheduler",
    "pndm": "PNDMScheduler", "lms": "LMSDiscreteScheduler", "heun": "HeunDiscreteScheduler",
    "unipc": "UniPCMultistepScheduler",
}
STEP_TIMEOUT_S = 600  # one denoising step longer than this means the worker is stuck


def make_scheduler(name: str, current):
    """The scheduler ``name`` built from the model's own scheduler config (same noise schedule)."""
    if name == "default":
        return current.__class__.from_config(current.config)
    import diffusers

    return getattr(diffusers, SCHEDULER_CLASSES[name]).from_config(current.config)


def load_diffusers(path: str, kind: str, torch_dtype):
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


class DiffusionPipeline(Base):
    task = "image"
    runtime = "diffusers"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        import torch

        self.torch = torch
        self.cond = read_conditioning(card.path)
        # Half precision on GPUs; float32 on CPU, where bf16 measured slower on these small models
        # (benchmarks/bench_image.py) and --dtype bfloat16 stays available.
        auto = "float16" if self.device.startswith("cuda") else "float32"
        torch_dtype, self.dtype = resolve_dtype(dtype, self.device, auto)
        self.pipe = cached_model(card, self.runtime, self.device, self.dtype, "pipeline",
                                 lambda: self._load(torch_dtype))

    def _load(self, torch_dtype):
        pipe = load_diffusers(self.card.path, self.cond.kind, torch_dtype).to(self.device)
        for part in pipe.components.values():
            if hasattr(part, "requires_grad_"):
                part.requires_grad_(False)
        denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
        if denoiser is not None and self.device != "cpu":  # faster convolutions on GPUs
            denoiser.to(memory_format=self.torch.channels_last)
        return pipe

    # ------------------------------------------------------------------ run

    def settings(self, inputs, options):
        prompt = inputs[0].text if inputs else None
        label = check_request(self.cond, self.card.name, prompt, options)
        steps = options.steps or self.cond.default_steps
        guidance = options.guidance if options.guidance is not None else self.cond.default_guidance
        w, h = parse_size(options.size) if options.size else self.cond.native
        seed = options.seed if options.seed is not None else random.randrange(2 ** 31)
        scheduler = make_scheduler(options.scheduler, self.pipe.scheduler)
        gen = Generation(prompt=prompt, label=label, negative=options.negative, steps=steps,
                         scheduler=scheduler.__class__.__name__, guidance=guidance, width=w, height=h,
                         model=self.card.name, model_digest=self.card.digest,
                         images=[Image(seed=seed + i) for i in range(options.n)])
        return gen, scheduler

    def run(self, inputs, options, clock):
        gen, scheduler = self.settings(inputs, options)
        if self.cond.kind == "text":
            timing = yield from self._run_text(gen, scheduler, clock)
        elif hasattr(self.pipe, "unet") and self.pipe.unet.__class__.__name__ == "UNet2DModel":
            timing = yield from self._run_unet(gen, scheduler, clock)
        else:
            raise TaskError(f"`{self.card.name}` is a {self.card.architecture}; taskrun runs "
                            f"text-to-image pipelines and pixel-space UNet2DModel folders")
        encode_s, loop_s, decode_s, n_steps, compile_s = timing
        yield ev.Item(0, gen.prompt or (f"label {gen.label}" if gen.label else "unconditional"), gen)
        total = encode_s + loop_s + decode_s
        yield ev.Done(Metrics(images=len(gen.images), steps=n_steps, s_per_step=loop_s / max(n_steps, 1),
                              encode_s=encode_s, decode_s=decode_s,
                              images_per_s=len(gen.images) / total if total > 0 else 0.0,
                              compile_s=compile_s, width=gen.width, height=gen.height))

    # ------------------------------------------------------------------ pixel-space UNet

    def _run_unet(self, gen: Generation, scheduler, clock):
        """Our own loop for UNet2DModel folders; returns (encode_s, loop_s, decode_s)."""
        torch, unet = self.torch, self.pipe.unet
        n, cfg = len(gen.images), self.cond.cfg and (gen.guidance or 0) != 1
        batch = 2 * n if cfg else n
        t0 = time.perf_counter()
        with clock.scope("encode"):
            labels = None
            if gen.label is not None:
                idx = self.cond.label_index(gen.label)
                labels = torch.full((n,), idx, dtype=torch.long, device=self.device)
                if cfg:  # one batch: the conditional half, then the "no class" half
                    labels = torch.cat([labels, torch.full_like(labels, self.cond.null_class)])
            shape = (1, unet.config.in_channels, gen.height, gen.width)
            noise = torch.cat([torch.randn(shape, generator=torch.Generator().manual_seed(im.seed))
                               for im in gen.images]).to(self.device, unet.dtype)
            scheduler.set_timesteps(gen.steps, device=self.device)
            x = noise * scheduler.init_noise_sigma
            step_gen = torch.Generator(device=self.device).manual_seed(gen.images[0].seed)
            # Stochastic samplers take the generator; deterministic ones (LMS, PNDM) have no such argument.
            extra = {"generator": step_gen} if "generator" in inspect.signature(scheduler.step).parameters else {}
            x_in = scheduler.scale_model_input(torch.cat([x, x]) if cfg else x, scheduler.timesteps[0])
        with clock.scope("compile"):
            denoise, compile_s = self._denoiser(x_in, scheduler.timesteps[0], labels)
        t1 = time.perf_counter()
        total = len(scheduler.timesteps)  # Heun runs two model calls per step: count what runs
        with clock.scope("denoise"), _threads_for(self.device, gen, batch):
            last = t1
            for i, t in enumerate(scheduler.timesteps):
                inp = scheduler.scale_model_input(torch.cat([x, x]) if cfg else x, t)
                out = denoise(inp, t, labels)
                if cfg:
                    cond, uncond = out.chunk(2)
                    out = uncond + gen.guidance * (cond - uncond)
                x = scheduler.step(out, t, x, **extra).prev_sample
                now = time.perf_counter()
                yield ev.Step(i + 1, total, now - last)
                last = now
        t2 = time.perf_counter()
        with clock.scope("decode"):
            self._to_pixels(gen, (x.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy())
        t3 = time.perf_counter()
        return t1 - t0 - compile_s, t2 - t1, t3 - t2, total, compile_s

    def _denoiser(self, x, t, labels):
        """The UNet2DModel as a function of (x, t, labels), and the seconds spent tracing it."""
        unet = self.pipe.unet
        key = ("unet2d", tuple(x.shape), x.dtype, t.dtype, None if labels is None else tuple(labels.shape))
        example = (x, t, labels) if labels is not None else (x, t)
        graph, compile_s = self._traced(key, _UNetCall(unet), example)
        if graph is None:
            return (lambda a, b, c: unet(a, b, class_labels=c, return_dict=False)[0]), 0.0
        return (graph if labels is not None else (lambda a, b, c: graph(a, b))), compile_s

    def _traced(self, key, module, example):
        """(a traced graph of ``module`` for inputs shaped like ``example``, seconds spent tracing
        it now), or (None, 0) for the first job of that shape.

        For models this small, Python overhead per call dominates a step: a traced graph runs a
        step 1.3x (digits-ddpm) to 1.8x (tiny SD) faster with identical pixels
        (benchmarks/bench_image.py). Tracing takes 0.3 s to a few seconds, more than it saves in
        one 25-step job, so a one-off job never pays for it; from the second job with the
        same shapes in one process (a batch, a chain, a server) it does, and the graph is kept
        with the loaded model.
        """
        state = self.pipe.__dict__.setdefault("_taskrun_traced", {"uses": {}, "graphs": {}})
        state["uses"][key] = state["uses"].get(key, 0) + 1
        if key in state["graphs"]:
            return state["graphs"][key], 0.0
        if state["uses"][key] < 2:
            return None, 0.0
        t0 = time.perf_counter()
        with warnings.catch_warnings():  # the tracer warns about shape checks it fixes as constants
            warnings.simplefilter("ignore")
            state["graphs"][key] = self.torch.jit.trace(module, example, check_trace=False)
        return state["graphs"][key], time.perf_counter() - t0

    @staticmethod
    def _to_pixels(gen: Generation, arr) -> None:
        import numpy as np

        pixels = (arr * 255).round().astype(np.uint8)
        for im, px in zip(gen.images, pixels):
            im.pixels = px

    # ------------------------------------------------------------------ text-to-image

    def _run_text(self, gen: Generation, scheduler, clock):
        """The library's pipeline call in a worker thread; returns (encode_s, loop_s, decode_s)."""
        torch, pipe = self.torch, self.pipe
        pipe.scheduler = scheduler
        denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
        marks: dict[str, float] = {}
        events: queue.Queue = queue.Queue()

        def first_forward(module, args):  # the loop starts at the first denoiser call
            marks.setdefault("loop", time.perf_counter())

        def on_step(p, i, t, kw):
            now = time.perf_counter()
            total = getattr(p, "num_timesteps", None) or gen.steps
            events.put(ev.Step(i + 1, total, now - marks.get("last", marks["loop"])))
            marks["n"] = i + 1
            marks["last"] = now
            return {}

        kwargs = dict(prompt=gen.prompt, num_inference_steps=gen.steps, height=gen.height,
                      width=gen.width, num_images_per_prompt=len(gen.images), output_type="np",
                      generator=[torch.Generator(device=self.device).manual_seed(im.seed) for im in gen.images],
                      callback_on_step_end=on_step)
        if gen.guidance is not None:
            kwargs["guidance_scale"] = gen.guidance
        if gen.negative:
            kwargs["negative_prompt"] = gen.negative
        result: dict = {}

        def work():
            try:
                # set here: the thread count is per thread, and this thread runs the loop
                with torch.inference_mode(), _threads_for(self.device, gen, 2 * len(gen.images)):
                    marks["start"] = time.perf_counter()
                    out = pipe(**kwargs)
                    marks["end"] = time.perf_counter()
                    result["images"] = out.images
            except BaseException as exc:  # handed to the consumer, never lost in the thread
                result["error"] = exc
            finally:
                events.put(None)

        hook = denoiser.register_forward_pre_hook(first_forward)
        if denoiser.__class__.__name__ == "UNet2DConditionModel":
            denoiser.forward = self._traced_forward(denoiser, marks)
        worker = threading.Thread(target=work, name="taskrun-image", daemon=True)
        try:
            with clock.scope("generate"):
                worker.start()
                while True:
                    try:
                        item = events.get(timeout=STEP_TIMEOUT_S)
                    except queue.Empty:
                        raise TaskError(f"no denoising step finished in {STEP_TIMEOUT_S}s; the model "
                                        f"is too slow for this device or stuck") from None
                    if item is None:
                        break
                    yield item
                worker.join()
        finally:
            hook.remove()
            denoiser.__dict__.pop("forward", None)  # back to the class's own forward
        if "error" in result:
            raise result["error"]
        self._to_pixels(gen, result["images"])
        loop_start, loop_end = marks["loop"], marks.get("last", marks["loop"])
        compile_s = marks.get("compile_s", 0.0)  # traced at the first step: neither encode nor loop
        return (loop_start - compile_s - marks["start"], loop_end - loop_start, marks["end"] - loop_end,
                marks.get("n", 0), compile_s)

    def _traced_forward(self, unet, marks):
        """UNet2DConditionModel.forward that runs a traced graph for the plain (sample, timestep,
        prompt embeddings) call of a Stable Diffusion loop, and the model itself for anything else
        (SDXL's added conditioning, LoRA scales, ControlNet residuals). Tracing time is moved out
        of the loop's timing into compile_s."""
        torch, job = self.torch, {}
        original = type(unet).forward

        def forward(sample, timestep, encoder_hidden_states=None, *args, return_dict=True, **kw):
            plain = not args and all(v is None for v in kw.values()) and torch.is_tensor(timestep) \
                and encoder_hidden_states is not None
            if not plain:
                return original(unet, sample, timestep, encoder_hidden_states, *args,
                                return_dict=return_dict, **kw)
            if "graph" not in job:  # once per job: count the use, trace on the second job
                key = ("unet2dcond", tuple(sample.shape), sample.dtype, timestep.dtype,
                       tuple(timestep.shape), tuple(encoder_hidden_states.shape))
                job["graph"], compile_s = self._traced(key, _CondUNetCall(unet),
                                                       (sample, timestep, encoder_hidden_states))
                marks["compile_s"] = compile_s
                marks["loop"] = marks["loop"] + compile_s
            if job["graph"] is None:
                return original(unet, sample, timestep, encoder_hidden_states, return_dict=return_dict)
            out = job["graph"](sample, timestep, encoder_hidden_states)
            if return_dict:
                from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

                return UNet2DConditionOutput(sample=out)
            return (out,)

        return forward



class _UNetCall(torch.nn.Module):
    """UNet2DModel.forward with positional inputs and a plain tensor out, for torch.jit.trace."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, x, t, labels=None):
        return self.unet(x, t, class_labels=labels, return_dict=False)[0]


class _CondUNetCall(torch.nn.Module):
    """UNet2DConditionModel's own forward (not an instance override) with positional inputs."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, x, t, encoder_hidden_states):
        return type(self.unet).forward(self.unet, x, t, encoder_hidden_states, return_dict=False)[0]


# A denoising step on small images is many small ops: one thread beats two that wake each other
# (digits-ddpm, 10 images: 0.013 s/step on one thread, 0.021 on two). Large images keep them all.
SMALL_WORK_PIXELS = 64 * 64 * 2


def _threads_for(device: str, gen: Generation, batch: int):
    if gen.width * gen.height * batch <= SMALL_WORK_PIXELS:
        return decode_threads(device)
    return contextlib.nullcontext()
