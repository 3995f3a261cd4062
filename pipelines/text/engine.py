"""The text-encoder engine: the one interface that embed, search and zero-shot classify drive.

An engine turns token ids into one pooled vector per text, on one runtime. Everything above it
(length-sorted batching, truncation to the model's window, normalisation, progress) is written once
in pipelines/text/encoder.py, so adding a runtime is one module with a subclass of
``TextEncoderEngine`` plus its rows in ``taskrun.pipelines.RUNTIMES``. Two exist: transformers
(hf_encoder.py) and ONNX Runtime on a cached export (ort_encoder.py, onnx_export.py):

    ("embed", "onnxruntime"): Runtime(_P + "text.embed:EmbedPipeline", engine=_P + "text.ort_encoder:OrtTextEncoder")

A subclass sets the facts in ``__init__`` (``runtime`` as a class attribute) and implements
``tokenize`` and ``encode_batch``; ``load`` caches the instance per (model, runtime, device, dtype).
The helpers at the bottom read a sentence-transformers folder's settings, for any engine.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.tasks.base import ModelCard


class TextEncoderEngine(ABC):
    """A sentence encoder on one runtime, loaded with its weights.

    Facts, set by ``__init__``: ``runtime`` (the runtime's name, as in the RUNTIMES table),
    ``device`` and ``dtype`` (what the engine actually chose, for the run log), ``dim`` (the vector
    width) and ``max_tokens`` (the model's window, special tokens included).
    """

    runtime: str = ""
    device: str
    dtype: str
    dim: int
    max_tokens: int
    # At most this many padded tokens per forward pass (None: only the caller's batch size counts);
    # set where a runtime measured a limit (pipelines/text/encoder.py: batches).
    batch_tokens: int | None = None

    @abstractmethod
    def __init__(self, card: ModelCard, device: str, dtype: str) -> None:
        """Load the tokenizer and weights of ``card``; a model that cannot load raises TaskError."""

    @classmethod
    def load(cls, card: ModelCard, device: str, dtype: str) -> TextEncoderEngine:
        """The engine for ``card``, loaded once per process: a job that needs it twice (a chain,
        embed then search) reads the weights once."""
        return cached_model(card, cls.runtime, device, dtype, "text-encoder", lambda: cls(card, device, dtype))

    @abstractmethod
    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text, special tokens included and NOT truncated: the caller needs the full
        lengths to sort batches and to tell which texts the window cuts."""

    @abstractmethod
    def encode_batch(self, ids: list[list[int]]) -> np.ndarray:
        """One pooled, unnormalised float32 vector per row of ``ids`` (shape ``(len(ids), dim)``).

        Rows are at most ``max_tokens`` long and may differ in length: the engine pads them to the
        longest row and masks the padding out of the pooling."""


def pad_rows(ids: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)`` as int64 arrays: each row padded with ``pad`` to the longest."""
    width = max(len(x) for x in ids)
    input_ids = np.full((len(ids), width), pad, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for j, row in enumerate(ids):
        input_ids[j, : len(row)] = row
        mask[j, : len(row)] = 1
    return input_ids, mask


def max_seq_length(path: Path, model_max_length: int | None) -> int:
    """The window a sentence-transformers folder declares, else the tokenizer's own (``None`` or a
    tokenizer's "no limit" sentinel mean 512)."""
    st = path / "sentence_bert_config.json"
    if st.exists():
        try:
            return int(json.loads(st.read_text())["max_seq_length"])
        except (KeyError, ValueError, json.JSONDecodeError):
            pass
    n = model_max_length or 512
    return n if n < 100_000 else 512


def pooling_mode(path: Path) -> str:
    """ "cls" when the folder's 1_Pooling config says so, else "mean"."""
    cfg = path / "1_Pooling" / "config.json"
    if cfg.exists():
        try:
            if json.loads(cfg.read_text()).get("pooling_mode_cls_token"):
                return "cls"
        except json.JSONDecodeError:
            pass
    return "mean"
