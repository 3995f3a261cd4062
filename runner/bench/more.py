"""`run bench generate` and `run bench image`: taskrun against plain transformers ``generate`` and
llama.cpp (llama-cpp-python, where it imports), and against a plain diffusers loop, on the same
weights. The timing is runner/bench/core.py's; see runner/bench/suites.py, embed.py and classify.py for the other tasks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from taskrun.runner.bench.core import Contender, Skipped
from taskrun.runner.bench.suites import Suite, missing, pick, taskrun_job, with_env
from taskrun.tasks.base import Input

PROMPT = (
    "Write a short story about a young astronomer named Mira who builds her own telescope from "
    "a cardboard tube and two old lenses."
)


def generate(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """Greedy decoding of ``n`` new tokens from the same prompt: taskrun generate (its default
    runtime and dtype) against transformers ``generate`` in float32 and llama.cpp. Throughput is
    new tokens per second of the whole call (prompt included)."""
    model = model or "smollm2-135m"
    n = 32 if quick else 128
    prompt = Path(data[0]).read_text() if data else PROMPT
    options = {"max_tokens": n, "temperature": 0.0, "stream": False}
    suite = Suite(
        "generate",
        model,
        "tokens",
        n,
        # every run reads the prompt afresh, as the llama.cpp contender's (reset) does:
        # taskrun's prompt cache would answer a repeated prompt from its kept logits
        [
            Contender(
                "taskrun",
                with_env(
                    {"TASKRUN_PROMPT_CACHE": "0"},
                    taskrun_job("generate", [Input("prompt", "text", text=prompt)], options, model),
                ),
                "taskrun",
                f"greedy, {n} tokens",
            )
        ],
    )
    if pick(against, "transformers"):
        suite.contenders.append(Contender("transformers", _plain(model, prompt, n), note="generate, float32, greedy"))
    if pick(against, "llama.cpp"):
        if missing("llama_cpp"):
            suite.skipped.append(
                Skipped("llama.cpp", "llama-cpp-python is not installed (pip install llama-cpp-python)")
            )
        else:
            suite.contenders.append(
                Contender(
                    "llama.cpp",
                    _llamacpp(model, prompt, n),
                    note="llama-cpp-python create_completion, greedy, on the llama.cpp library taskrun loads",
                )
            )
    suite.quality = _same_text
    return suite


def _chat_ids(tok, prompt: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]


def _plain(model: str, prompt: str, n: int):
    def load():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads
        from taskrun.pipelines.llm.gguf_convert import ensure_converted

        configure_threads()
        card = resolve(model)
        folder = (
            ensure_converted(card)
            if str(card.path).endswith(".gguf") or card.runtime == "llamacpp"
            else Path(card.path)
        )
        net = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(folder)
        ids = torch.tensor([_chat_ids(tok, prompt)])

        def run():
            with torch.inference_mode():
                out = net.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
                )
            return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

        return run

    return load


def _llamacpp(model: str, prompt: str, n: int):
    def load():
        from taskrun.models.gguf import gguf_file
        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import cpu_threads
        from taskrun.pipelines.llm.llamacpp_native import library

        Llama = library().Llama  # the llama.cpp library taskrun loads (same kernels): engines compared, not builds
        path = gguf_file(resolve(model))
        if path is None:
            raise RuntimeError(f"`{model}` has no GGUF file for llama.cpp")
        # taskrun's threads (benchmarks/bench_generate.py gives every path the same): one for the
        # token-by-token loop, every core for the prompt
        decode = int(os.environ.get("TASKRUN_DECODE_THREADS", "1"))
        llm = Llama(str(path), n_ctx=2048, n_threads=decode, n_threads_batch=cpu_threads(), verbose=False)
        msgs = [{"role": "user", "content": prompt}]

        def run():
            llm.reset()
            out = llm.create_chat_completion(msgs, max_tokens=n, temperature=0.0)
            return out["choices"][0]["message"]["content"]

        return run

    return load


def _same_text(outs: dict[str, Any]) -> dict:
    """How many leading characters each reference shares with taskrun's answer (greedy decoding
    of the same weights agrees until rounding differences tip one token)."""
    ours = outs.get("taskrun")
    if ours is None:
        return {}
    text = ours.results[0].text
    q = {}
    for name, o in outs.items():
        if name != "taskrun":
            k = next((i for i, (a, b) in enumerate(zip(text, o)) if a != b), min(len(text), len(o)))
            q[name] = {"common_prefix_chars": k, "taskrun_chars": len(text)}
    return q


# --------------------------------------------------------------------------- image


def image(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun image against the plain diffusers loop a user writes for the class-conditional
    digits model (UNet2DModel + DDIM, float32, both guidance halves in one batch)."""
    model = model or "digits-ddpm"
    n, steps = (4, 10) if quick else (10, 25)
    options = {"label": "7", "n": n, "steps": steps, "seed": 42}
    suite = Suite(
        "image",
        model,
        "images",
        n,
        [Contender("taskrun", taskrun_job("image", [], options, model), "taskrun", f"label 7, {steps} steps")],
    )
    if pick(against, "diffusers"):
        if model != "digits-ddpm" or missing("diffusers"):
            suite.skipped.append(
                Skipped(
                    "diffusers",
                    "the plain diffusers loop here is written for digits-ddpm (and needs diffusers installed)",
                )
            )
        else:
            suite.contenders.append(Contender("diffusers", _digits(model, n, steps), note="DDIM, float32"))
    return suite


def _digits(model: str, n: int, steps: int, label: int = 7, seed: int = 42):
    def load():
        import numpy as np
        import torch
        from diffusers import DDIMScheduler, UNet2DModel

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads

        configure_threads()
        folder = Path(resolve(model).path)
        unet = UNet2DModel.from_pretrained(folder / "unet").eval()
        sched = DDIMScheduler.from_pretrained(folder / "scheduler")
        cond = json.loads((folder / "conditioning.json").read_text())
        guidance, null = cond["default_guidance"], cond["null_class"]

        def run():
            with torch.inference_mode():
                x = torch.cat(
                    [torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(seed + i)) for i in range(n)]
                )
                sched.set_timesteps(steps)
                y, y0 = torch.full((n,), label), torch.full((n,), null)
                for t in sched.timesteps:
                    c, u = unet(torch.cat([x, x]), t, class_labels=torch.cat([y, y0])).sample.chunk(2)
                    x = sched.step(u + guidance * (c - u), t, x).prev_sample
                return ((x / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)

        return run

    return load
