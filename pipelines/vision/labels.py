"""What the image classifiers (EfficientNet on torch or ONNX Runtime, any classifier on
transformers) share after the forward pass: scores from the logits, and each image's best labels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from taskrun.tasks.classify import Label, Result


def top_labels(probs: np.ndarray, id2label: dict[int, str], k: int) -> list[Label]:
    """The ``k`` best labels of one image, best first; a class without a name shows its index."""
    order = np.argsort(-probs)[:k]
    return [Label(id2label.get(int(j), str(int(j))), float(probs[j])) for j in order]


def label_batch(
    batch: list, logits: Any, id2label: dict[int, str], k: int, inputs: list, multi: bool = False
) -> Iterator[tuple[int, Result]]:
    """(index, Result) for each image of ``batch`` from its row of ``logits``: softmax over the
    classes, or an independent sigmoid per class for a multi-label head."""
    if isinstance(logits, np.ndarray):  # ONNX Runtime's output
        z = logits.astype(np.float32)
        if multi:
            probs = 1.0 / (1.0 + np.exp(-z))
        else:
            e = np.exp(z - z.max(axis=-1, keepdims=True))
            probs = e / e.sum(axis=-1, keepdims=True)
    else:
        import torch

        logits = logits.float()
        probs = (torch.sigmoid(logits) if multi else torch.softmax(logits, dim=-1)).cpu().numpy()
    for (index, _), p in zip(batch, probs):
        yield index, Result(input=inputs[index].describe(), labels=top_labels(p, id2label, k))
