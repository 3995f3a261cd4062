"""Sentence encoding over any text-encoder engine: truncate, length-sort, batch, normalise.

Written once for every runtime (the engines are in pipelines/text/engine.py) and shared by embed,
search and zero-shot classify. Speed on CPU comes largely from the sorting, measured in
benchmarks/bench_embed.py: each batch pads only to its own longest text, not the longest overall.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from taskrun.pipelines.base import EnginePipeline
from taskrun.pipelines.text.engine import TextEncoderEngine


class Encoding:
    """The vectors of ``texts`` (float32, in input order), with the tokens read per text and whether
    the model's window cut each one.

    ``steps()`` fills them batch by batch and yields the count of texts done after each, so a
    pipeline can report progress and time the work with ``timed``; ``encode()`` runs it to the end.
    """

    def __init__(self, engine: TextEncoderEngine, texts: list[str], batch_size: int = 64,
                 normalize: bool = True) -> None:
        self.engine, self.texts, self.batch_size, self.normalize = engine, texts, batch_size, normalize
        self.vectors = np.zeros((len(texts), engine.dim), dtype=np.float32)
        self.tokens: list[int] = []
        self.truncated: list[bool] = []

    def steps(self) -> Iterator[int]:
        """Encode every text; yields the number done after each batch."""
        ids = self._tokenize()
        order = sorted(range(len(ids)), key=lambda i: self.tokens[i], reverse=True)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            vec = self.engine.encode_batch([ids[i] for i in idx])
            self.vectors[idx] = _l2_normalize(vec) if self.normalize else vec
            yield min(start + self.batch_size, len(order))

    def _tokenize(self) -> list[list[int]]:
        # Tokenise once, untruncated: the lengths sort the batches and tell which texts the window
        # cut. A cut text keeps its closing special token, as the tokenizer's own truncation does.
        limit = self.engine.max_tokens
        ids = self.engine.tokenize(self.texts)
        self.truncated = [len(x) > limit for x in ids]
        ids = [x if len(x) <= limit else x[: limit - 1] + x[-1:] for x in ids]
        self.tokens = [len(x) for x in ids]
        return ids


class EncoderPipeline(EnginePipeline):
    """A pipeline driven by a text-encoder engine, named by its RUNTIMES row."""

    engine: TextEncoderEngine


def encode(engine: TextEncoderEngine, texts: list[str], batch_size: int = 64,
           normalize: bool = True) -> Encoding:
    """``texts`` encoded to the end, for callers that report no progress."""
    enc = Encoding(engine, texts, batch_size, normalize)
    for _ in enc.steps():
        pass
    return enc


def _l2_normalize(vec: np.ndarray) -> np.ndarray:
    # The same floor as torch.nn.functional.normalize, so an all-zero vector stays zero.
    return vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
