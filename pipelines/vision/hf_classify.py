"""Image classification on transformers: any AutoModelForImageClassification (ViT, ResNet, ConvNeXt,
EfficientNet, ...) with its own image processor and id2label. pipelines/classify_transformers.py
dispatches image models here and records the metrics.
"""

from __future__ import annotations

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import auto_dtype, resolve_dtype
from taskrun.pipelines.vision.batching import run_batches
from taskrun.tasks.base import TaskError
from taskrun.tasks.classify import Label, Result


def load_processor(path: str):
    """The model's image processor. Without torchvision, transformers falls back to its PIL
    processors, which give the same pixels."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise TaskError(f"{path} has no usable image processor (preprocessor_config.json): {exc}") from None


class ImageClassifier:
    def __init__(self, card, device, dtype):
        from transformers import AutoModelForImageClassification

        self.device = device
        # float32 unless asked: bf16 has not been checked against each hub model's accuracy.
        self.torch_dtype, self.dtype = resolve_dtype(dtype, device, auto_dtype(device, prefer_bf16=False))
        self.processor = cached_model(card, "transformers", device, self.dtype, "image-processor",
                                      lambda: load_processor(card.path))
        self.model = cached_model(card, "transformers", device, self.dtype, "image-cls",
                                  lambda: AutoModelForImageClassification.from_pretrained(
                                      card.path, dtype=self.torch_dtype).to(device).eval())
        cfg = self.model.config
        self.id2label = {int(k): v for k, v in (cfg.id2label or {}).items()}
        self.multi = getattr(cfg, "problem_type", None) == "multi_label_classification"

    def run(self, inputs, options):
        """Item / ItemError / Progress events, one result per input index."""
        stats: dict = {}
        yield from run_batches(inputs, options.batch_size, lambda batch: self._batch(batch, inputs, options), stats)

    def _batch(self, batch, inputs, options):
        import torch

        enc = self.processor(images=[img for _, img in batch], return_tensors="pt")
        pixels = enc["pixel_values"].to(self.device, self.torch_dtype)
        logits = self.model(pixel_values=pixels).logits.float()
        probs = (torch.sigmoid(logits) if self.multi else torch.softmax(logits, -1)).cpu().numpy()
        for (index, _), p in zip(batch, probs):
            order = np.argsort(-p)[: options.top_k]
            labels = [Label(self.id2label.get(int(k), str(int(k))), float(p[k])) for k in order]
            yield index, Result(input=inputs[index].describe(), labels=labels)
