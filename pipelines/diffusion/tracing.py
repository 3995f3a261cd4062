"""Traced UNets: a torch.jit graph of the denoiser for each input shape a process runs twice.

For models this small, Python overhead per call dominates a step: a traced graph runs a step
1.3x (digits-ddpm) to 1.8x (tiny SD) faster with identical pixels (benchmarks/bench_image.py).
Tracing takes 0.3 s to a few seconds, more than it saves in one 25-step job, so a one-off job
never pays for it; from the second job with the same shapes in one process (a batch, a chain, a
server) it does, and the graph is kept with the loaded model.
"""

from __future__ import annotations

import time
import warnings

from taskrun.pipelines.device import configure_threads

configure_threads()  # before torch starts its thread pool (passive OpenMP waits on shared cores)
import torch  # noqa: E402


class UNetCall(torch.nn.Module):
    """A UNet's forward with positional inputs and a plain tensor out, for torch.jit.trace.

    ``third`` is the keyword the third input goes to (class_labels, encoder_hidden_states). With
    ``class_forward`` the class's own forward runs rather than the instance's, which a
    text-to-image job replaces with ``traced_forward`` below.
    """

    def __init__(self, unet, third: str, class_forward: bool = False):
        super().__init__()
        self.unet = unet
        self.third = third
        self.class_forward = class_forward

    def forward(self, x, t, extra=None):
        call = type(self.unet).forward.__get__(self.unet) if self.class_forward else self.unet
        return call(x, t, **{self.third: extra}, return_dict=False)[0]


def traced(pipe, key, module, example):
    """(a traced graph of ``module`` for inputs shaped like ``example``, seconds spent tracing
    it now), or (None, 0) for the first job of that shape. Graphs are kept on ``pipe``."""
    state = pipe.__dict__.setdefault("_taskrun_traced", {"uses": {}, "graphs": {}})
    state["uses"][key] = state["uses"].get(key, 0) + 1
    if key in state["graphs"]:
        return state["graphs"][key], 0.0
    if state["uses"][key] < 2:
        return None, 0.0
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the tracer warns about shape checks it fixes as constants
        warnings.simplefilter("ignore")
        state["graphs"][key] = torch.jit.trace(module, example, check_trace=False)
    return state["graphs"][key], time.perf_counter() - t0


def unet2d_denoiser(pipe, x, t, labels):
    """The pipe's UNet2DModel as a function of (x, t, labels), and the seconds spent tracing it."""
    unet = pipe.unet
    key = ("unet2d", tuple(x.shape), x.dtype, t.dtype, None if labels is None else tuple(labels.shape))
    example = (x, t, labels) if labels is not None else (x, t)
    graph, compile_s = traced(pipe, key, UNetCall(unet, "class_labels"), example)
    if graph is None:
        return (lambda a, b, c: unet(a, b, class_labels=c, return_dict=False)[0]), 0.0
    return (graph if labels is not None else (lambda a, b, c: graph(a, b))), compile_s


def traced_forward(pipe, unet, marks: dict):
    """UNet2DConditionModel.forward that runs a traced graph for the plain (sample, timestep,
    prompt embeddings) call of a Stable Diffusion loop, and the model itself for anything else
    (SDXL's added conditioning, LoRA scales, ControlNet residuals). Tracing time is moved out
    of the loop's timing (``marks["loop"]``) into ``marks["compile_s"]``."""
    job: dict = {}
    original = type(unet).forward

    def forward(sample, timestep, encoder_hidden_states=None, *args, return_dict=True, **kw):
        plain = (
            not args
            and all(v is None for v in kw.values())
            and torch.is_tensor(timestep)
            and encoder_hidden_states is not None
        )
        if not plain:
            return original(unet, sample, timestep, encoder_hidden_states, *args, return_dict=return_dict, **kw)
        if "graph" not in job:  # once per job: count the use, trace on the second job
            key = (
                "unet2dcond",
                tuple(sample.shape),
                sample.dtype,
                timestep.dtype,
                tuple(timestep.shape),
                tuple(encoder_hidden_states.shape),
            )
            job["graph"], compile_s = traced(
                pipe, key, UNetCall(unet, "encoder_hidden_states", True), (sample, timestep, encoder_hidden_states)
            )
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
