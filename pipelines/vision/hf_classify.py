"""Image classification on transformers: any AutoModelForImageClassification (ViT, ResNet, ConvNeXt,
EfficientNet, ...) with its own image processor and id2label. pipelines/text/classify.py
dispatches image models here and records the metrics.
"""

from __future__ import annotations

from taskrun.pipelines.vision.batching import run_batches
from taskrun.pipelines.vision.hf_vision import load_hf_vision, processor_fit
from taskrun.pipelines.vision.labels import label_batch


class ImageClassifier:
    def __init__(self, card, device, dtype):
        self.device = device
        (self.torch_dtype, self.dtype, self.processor, self.model, self.id2label) = load_hf_vision(
            card, device, dtype, "AutoModelForImageClassification", "image-cls"
        )
        self.multi = getattr(self.model.config, "problem_type", None) == "multi_label_classification"

    def run(self, inputs, options):
        """Item / ItemError / Progress events, one result per input index."""
        stats: dict = {}
        yield from run_batches(
            inputs,
            options.batch_size,
            lambda batch: self._batch(batch, inputs, options),
            stats,
            fit=processor_fit(self.processor),
        )

    def _batch(self, batch, inputs, options):
        enc = self.processor(images=[img for _, img in batch], return_tensors="pt")
        pixels = enc["pixel_values"].to(self.device, self.torch_dtype)
        logits = self.model(pixel_values=pixels).logits
        yield from label_batch(batch, logits, self.id2label, options.top_k, inputs, self.multi)
