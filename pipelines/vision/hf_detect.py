"""detect on transformers: any AutoModelForObjectDetection (DETR, YOLOS, RT-DETR, ...).

The model's own processor resizes and pads a batch, and its ``post_process_object_detection``
turns the predictions into boxes; given each image's original size, those boxes come back in
pixels of the original image (not of the resized one the model saw).
"""

from __future__ import annotations

import inspect

from taskrun.pipelines.base import Pipeline as Base
from taskrun.pipelines.vision.batching import annotate_item, measured_run
from taskrun.pipelines.vision.hf_vision import load_hf_vision, processor_fit
from taskrun.tasks.base import TaskError
from taskrun.tasks.detect import Box, Metrics, Result
from taskrun.tasks.image_files import to_original


class DetectPipeline(Base):
    task = "detect"
    runtime = "transformers"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)

        def check_processor(processor):
            if not hasattr(processor, "post_process_object_detection"):
                raise TaskError(
                    f"the image processor of `{card.name}` has no object-detection "
                    f"post-processing; detect needs a DETR/YOLOS/RT-DETR-style model"
                )

        (self.torch_dtype, self.dtype, self.processor, self.model, self.id2label) = load_hf_vision(
            card, self.device, dtype, "AutoModelForObjectDetection", "detector", check_processor
        )
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
        enc = {
            k: (v.to(self.device, self.torch_dtype) if v.is_floating_point() else v.to(self.device))
            for k, v in enc.items()
            if isinstance(v, torch.Tensor) and (k != "pixel_mask" or self.masks_padding)
        }
        outputs = self.model(**enc)
        outputs.logits = outputs.logits.float()
        outputs.pred_boxes = outputs.pred_boxes.float()
        sizes = torch.tensor([(img.height, img.width) for img in images])
        found = self.processor.post_process_object_detection(outputs, threshold=options.threshold, target_sizes=sizes)
        for (index, image), det in zip(group, found):
            result = Result(input=inputs[index].describe(), width=image.width, height=image.height)
            for score, label, box in zip(det["scores"].tolist(), det["labels"].tolist(), det["boxes"].tolist()):
                x0, y0, x1, y1 = _clip(box, image.width, image.height)
                result.boxes.append(Box(self.id2label.get(int(label), str(int(label))), score, x0, y0, x1, y1))
            result.boxes.sort(key=lambda b: -b.score)
            yield index, image, result

    def run(self, inputs, options, clock):
        several = len(inputs) > 1

        def process(batch):
            for group in self._groups(batch):
                for index, image, result in self._detect(group, inputs, options):
                    yield annotate_item(index, image, to_original(result, image), options, several, inputs)

        # fit: decoded no larger than the processor's own resize keeps (DETR: shortest edge 800),
        # the boxes mapped back to the original's pixels all the same; --annotate draws on the
        # picture as decoded, so it keeps the usual decode (as `run --remote` draws on its own)
        fit = None if options.annotate else processor_fit(self.processor)
        yield from measured_run(inputs, options.batch_size, process, clock, "detect", Metrics, fit=fit)


def _clip(box, width, height):
    x0, y0, x1, y1 = box
    return (min(max(x0, 0.0), width), min(max(y0, 0.0), height), min(max(x1, 0.0), width), min(max(y1, 0.0), height))
