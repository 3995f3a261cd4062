"""Sentence encoding over any text-encoder engine: truncate, length-sort, batch, normalise.

Written once for every runtime (the engines are in pipelines/text/engine.py) and shared by embed,
search and zero-shot classify. Speed on CPU comes from the sorting (each batch pads only to its
own longest text, not the longest overall), from a cap on padded tokens per batch where the engine
sets one, and from the runtime chosen for the CPU (``auto_runtime``); all measured in
benchmarks/bench_embed.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from taskrun.pipelines.base import EnginePipeline
from taskrun.pipelines.device import cpu_has_bf16
from taskrun.pipelines.text.engine import TextEncoderEngine
from taskrun.tasks.base import ModelCard


class Encoding:
    """The vectors of ``texts`` (float32, in input order), with the tokens read per text and whether
    the model's window cut each one.

    ``steps()`` fills them batch by batch and yields the count of texts done after each, so a
    pipeline can report progress and time the work with ``timed``; ``encode()`` runs it to the end.
    """

    def __init__(
        self, engine: TextEncoderEngine, texts: list[str], batch_size: int = 64, normalize: bool = True
    ) -> None:
        self.engine, self.texts, self.batch_size, self.normalize = engine, texts, batch_size, normalize
        self.vectors = np.zeros((len(texts), engine.dim), dtype=np.float32)
        self.tokens: list[int] = []
        self.truncated: list[bool] = []

    def steps(self) -> Iterator[int]:
        """Encode every text; yields the number done after each batch."""
        ids = self._tokenize()
        order = sorted(range(len(ids)), key=lambda i: self.tokens[i], reverse=True)
        done = 0
        for idx in batches(order, self.tokens, self.batch_size, self.engine.batch_tokens):
            vec = self.engine.encode_batch([ids[i] for i in idx])
            self.vectors[idx] = _l2_normalize(vec) if self.normalize else vec
            done += len(idx)
            yield done

    def _tokenize(self) -> list[list[int]]:
        # Tokenise once, untruncated: the lengths sort the batches and tell which texts the window
        # cut. A cut text keeps its closing special token, as the tokenizer's own truncation does.
        limit = self.engine.max_tokens
        ids = self.engine.tokenize(self.texts)
        self.truncated = [len(x) > limit for x in ids]
        ids = [x if len(x) <= limit else x[: limit - 1] + x[-1:] for x in ids]
        self.tokens = [len(x) for x in ids]
        return ids


def batches(order: list[int], tokens: list[int], batch_size: int, batch_tokens: int | None) -> Iterator[list[int]]:
    """``order`` (longest first) cut into batches of at most ``batch_size`` texts and, where the
    engine sets ``batch_tokens``, at most that many padded tokens (one text at the least): long
    texts go in smaller batches, so the activations of a batch stay in the CPU's caches."""
    start = 0
    while start < len(order):
        n = batch_size
        if batch_tokens:
            n = max(1, min(n, batch_tokens // max(1, tokens[order[start]])))
        yield order[start : start + n]
        start += n


class EncoderPipeline(EnginePipeline):
    """A pipeline driven by a text-encoder engine, named by its RUNTIMES row."""

    engine: TextEncoderEngine

    @classmethod
    def advise_model(cls, card: ModelCard, inputs: list, options: Any, **kw) -> tuple[ModelCard, list[str]]:
        """Before the model loads: the runtime a sentence encoder runs fastest on here (auto_runtime)."""
        return auto_runtime(cls.task, card, kw.get("runtime"), kw.get("device", "auto"), kw.get("dtype", "auto")), []


ORT_ENGINE = "taskrun.pipelines.text.ort_encoder:OrtTextEncoder"
# Encoders whose torch code the ONNX tracer follows (custom-code models such as NomicBert stay on
# transformers unless asked for by --runtime onnxruntime).
ONNX_ARCHITECTURES = r"^(Bert|MPNet|XLMRoberta|Roberta|DistilBert|Electra)Model$"


def auto_runtime(task: str, card: ModelCard, runtime: str | None, device: str, dtype: str) -> ModelCard:
    """``card`` with onnxruntime among its runtimes when it is a sentence encoder, and as its runtime
    when the user named none and it is the faster one here.

    Measured on all-MiniLM-L6-v2, 2,000 mixed sentences (benchmarks/bench_embed.py): on a CPU without
    bf16 matrix units (2 AVX2 cores) ONNX Runtime float32 ran 1.2-1.4x torch float32 on the same
    batches; on one with them (AMX) torch in bf16 ran 2.1x ONNX Runtime float32, and a GPU is faster
    than both. So: onnxruntime for the CPU in float32 on a CPU without bf16, where onnxruntime (and
    onnx, to export) are installed.
    """
    from taskrun.pipelines import RUNTIMES

    row = RUNTIMES.get((task, "onnxruntime"))  # classify's may be the image runtime's, not this one
    if (
        card.kind != "sentence-embedding"
        or card.format not in ("safetensors", "bin")
        or row is None
        or row.engine != ORT_ENGINE
    ):
        return card
    if "onnxruntime" not in card.runtimes:
        card = replace(card, runtimes=(*card.runtimes, "onnxruntime"))
    if runtime or card.runtime != "transformers" or not re.search(ONNX_ARCHITECTURES, card.architecture):
        return card
    cpu = device == "cpu" or device in ("auto", "", None) and not _maybe_accelerator()
    if cpu and dtype in ("auto", "float32", "", None) and not cpu_has_bf16() and _onnx_installed():
        card = replace(card, runtime="onnxruntime")
    return card


def _maybe_accelerator() -> bool:
    """Whether ``--device auto`` may find a GPU (NVIDIA, ROCm, Apple), told without importing torch."""
    return sys.platform == "darwin" or any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


def _onnx_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))


def encode(engine: TextEncoderEngine, texts: list[str], batch_size: int = 64, normalize: bool = True) -> Encoding:
    """``texts`` encoded to the end, for callers that report no progress."""
    enc = Encoding(engine, texts, batch_size, normalize)
    for _ in enc.steps():
        pass
    return enc


def _l2_normalize(vec: np.ndarray) -> np.ndarray:
    # The same floor as torch.nn.functional.normalize, so an all-zero vector stays zero.
    return vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
