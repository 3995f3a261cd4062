"""detect on transformers: any AutoModelForObjectDetection (DETR, YOLOS, RT-DETR, ...).

The model's own processor resizes and pads a batch, and its ``post_process_object_detection``
turns the predictions into boxes; given each image's original size, those boxes come back in
pixels of the original image (not of the resized one the model saw).
"""

from __future__ import annotations

import inspect

from taskrun.pipelines import cached_model
from taskrun.pipelines.base import Pipeline as Base
from taskrun.pipelines.device import auto_dtype, resolve_dtype
from taskrun.pipelines.vision.hf_classify import load_processor
from taskrun.pipelines.vision.batching import annotate_item, rate_metrics, run_batches
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.detect import Box, Metrics, Result


class DetectPipeline(Base):
    task = "detect"
    runtime = "transformers"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        from transformers import AutoModelForObjectDetection

        self.torch_dtype, self.dtype = resolve_dtype(dtype, self.device, auto_dtype(self.device, prefer_bf16=False))
        self.processor = cached_model(card, "transformers", self.device, self.dtype, "image-processor",
                                      lambda: load_processor(card.path))
        if not hasattr(self.processor, "post_process_object_detection"):
            raise TaskError(f"the image processor of `{card.name}` has no object-detection post-processing; "
                            f"detect needs a DETR/YOLOS/RT-DETR-style model")
        self.model = cached_model(card, "transformers", self.device, self.dtype, "detector",
                                  lambda: AutoModelForObjectDetection.from_pretrained(
                                      card.path, dtype=self.torch_dtype).to(self.device).eval())
        self.id2label = {int(k): v for k, v in (self.model.config.id2label or {}).items()}
        # DETR-like models take a pixel mask and ignore the padding of a mixed-size batch; a model
        # without one (YOLOS) would see the padding as image, so it is batched by size instead.
        self.masks_padding = "pixel_mask" in inspect.signature(self.model.forward).parameters

    def _groups(self, batch):
        if self.masks_padding:
            return [batch]
        by_size: dict = {}
        for index, image in batch:
            by_size.setdefault(image.size, []).append((index, image))
        return list(by_size.values())

    def _detect(self, group, inputs, options):
        import torch

        images = [img for _, img in group]
        enc = self.processor(images=images, return_tensors="pt")
        enc = {k: (v.to(self.device, self.torch_dtype) if v.is_floating_point() else v.to(self.device))
               for k, v in enc.items() if isinstance(v, torch.Tensor) and (k != "pixel_mask" or self.masks_padding)}
        outputs = self.model(**enc)
        outputs.logits = outputs.logits.float()
        outputs.pred_boxes = outputs.pred_boxes.float()
        sizes = torch.tensor([(img.height, img.width) for img in images])
        found = self.processor.post_process_object_detection(outputs, threshold=options.threshold,
                                                             target_sizes=sizes)
        for (index, image), det in zip(group, found):
            result = Result(input=inputs[index].describe(), width=image.width, height=image.height)
            for score, label, box in zip(det["scores"].tolist(), det["labels"].tolist(), det["boxes"].tolist()):
                x0, y0, x1, y1 = _clip(box, image.width, image.height)
                result.boxes.append(Box(self.id2label.get(int(label), str(int(label))), score, x0, y0, x1, y1))
            result.boxes.sort(key=lambda b: -b.score)
            yield index, image, result

    def run(self, inputs, options, clock):
        stats: dict = {}
        several = len(inputs) > 1

        def process(batch):
            for group in self._groups(batch):
                for index, image, result in self._detect(group, inputs, options):
                    yield annotate_item(index, image, result, options, several, inputs)

        with clock.scope("detect"):
            yield from run_batches(inputs, options.batch_size, process, stats)
        yield ev.Done(rate_metrics(Metrics, stats))


def _clip(box, width, height):
    x0, y0, x1, y1 = box
    return (min(max(x0, 0.0), width), min(max(y0, 0.0), height),
            min(max(x1, 0.0), width), min(max(y1, 0.0), height))
