"""Text-to-image models through the library's own pipeline call (AutoPipelineForText2Image, or
DiffusionPipeline), with one ``Step`` event per denoising step from ``callback_on_step_end``.

The call runs in a worker thread so steps reach the progress bar as they happen; the queue has a
timeout and the worker's exception is re-raised here. The loop's timing hangs off two hooks: a
pre-forward hook on the denoiser marks its first call, the step callback marks each step's end.
"""

from __future__ import annotations

import queue
import threading
import time

from taskrun.pipelines.diffusion.common import denoiser_of, threads_for, to_pixels
from taskrun.pipelines.diffusion.tracing import torch, traced_forward
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.clock import timed
from taskrun.tasks.image import Generation

STEP_TIMEOUT_S = 600  # one denoising step longer than this means the worker is stuck


def run_text(pipe, device: str, gen: Generation, scheduler, clock):
    """One Step per denoising step; returns (encode_s, loop_s, decode_s, steps, compile_s)."""
    pipe.scheduler = scheduler
    denoiser = denoiser_of(pipe)
    marks: dict[str, float] = {}
    events: queue.Queue = queue.Queue()
    result: dict = {}

    def first_forward(module, args):  # the loop starts at the first denoiser call
        marks.setdefault("loop", time.perf_counter())

    kwargs = _call_kwargs(gen, device, _on_step(gen, marks, events))
    worker = threading.Thread(
        target=_work, args=(pipe, kwargs, device, gen, marks, result, events), name="taskrun-image", daemon=True
    )
    hook = denoiser.register_forward_pre_hook(first_forward)
    if denoiser.__class__.__name__ == "UNet2DConditionModel":
        denoiser.forward = traced_forward(pipe, denoiser, marks)
    try:
        worker.start()
        yield from timed(_drain(events), lambda s: clock.add("generate", s))
        worker.join()
    finally:
        hook.remove()
        denoiser.__dict__.pop("forward", None)  # back to the class's own forward
    if "error" in result:
        raise result["error"]
    to_pixels(gen, result["images"])
    loop_start, loop_end = marks["loop"], marks.get("last", marks["loop"])
    compile_s = marks.get("compile_s", 0.0)  # traced at the first step: neither encode nor loop
    return (
        loop_start - compile_s - marks["start"],
        loop_end - loop_start,
        marks["end"] - loop_end,
        marks.get("n", 0),
        compile_s,
    )


def _on_step(gen: Generation, marks: dict, events: queue.Queue):
    """The pipeline's callback_on_step_end: a Step with the seconds since the last one."""

    def on_step(p, i, t, kw):
        now = time.perf_counter()
        total = getattr(p, "num_timesteps", None) or gen.steps
        events.put(ev.Step(i + 1, total, now - marks.get("last", marks["loop"])))
        marks["n"] = i + 1
        marks["last"] = now
        return {}

    return on_step


def _call_kwargs(gen: Generation, device: str, on_step) -> dict:
    """The pipeline call's arguments: each image's generator seeded with its own seed."""
    kwargs = dict(
        prompt=gen.prompt,
        num_inference_steps=gen.steps,
        height=gen.height,
        width=gen.width,
        num_images_per_prompt=len(gen.images),
        output_type="np",
        generator=[torch.Generator(device=device).manual_seed(im.seed) for im in gen.images],
        callback_on_step_end=on_step,
    )
    if gen.guidance is not None:
        kwargs["guidance_scale"] = gen.guidance
    if gen.negative:
        kwargs["negative_prompt"] = gen.negative
    return kwargs


def _work(pipe, kwargs: dict, device: str, gen: Generation, marks: dict, result: dict, events: queue.Queue) -> None:
    """The worker thread: the pipeline call, its images or its exception into ``result``."""
    try:
        # set here: the thread count is per thread, and this thread runs the loop
        with torch.inference_mode(), threads_for(device, gen, 2 * len(gen.images)):
            marks["start"] = time.perf_counter()
            out = pipe(**kwargs)
            marks["end"] = time.perf_counter()
            result["images"] = out.images
    except BaseException as exc:  # handed to the consumer, never lost in the thread
        result["error"] = exc
    finally:
        events.put(None)


def _drain(events: queue.Queue):
    """The worker's events until it is done; a step that never ends is an error, not a hang."""
    while True:
        try:
            item = events.get(timeout=STEP_TIMEOUT_S)
        except queue.Empty:
            raise TaskError(
                f"no denoising step finished in {STEP_TIMEOUT_S}s; the model is too slow for this device or stuck"
            ) from None
        if item is None:
            return
        yield item
