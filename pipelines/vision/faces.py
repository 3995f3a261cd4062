"""detect on plain torch: the MTCNN face detector (pipelines/vision/mtcnn.py) with facenet-pytorch's weights.

MTCNN runs one image at a time (its image pyramid depends on each image's size); a batch is a
loop, with one result or error per image and progress after each batch.

Its work is hundreds of tiny convolutions and crops, where waking a second intra-op thread costs
more than it saves: on the 2-core machine here one thread was 4-6× faster than two, for a
512 px and a 2048 px photo alike. So it runs single-threaded unless TASKRUN_THREADS says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import resolve_dtype, torch_threads
from taskrun.pipelines.vision.batching import TorchVision, annotate_item, measured_run
from taskrun.tasks.base import TaskError
from taskrun.tasks.detect import Box, Metrics, Result
from taskrun.tasks.image_files import original_scale, to_original


class FacePipeline(TorchVision):
    task, kind, runs = "detect", "face-detection", "runs the MTCNN face detector"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        # Tiny nets whose box regression is sensitive: float32 unless asked otherwise.
        self.torch_dtype, self.dtype = resolve_dtype(dtype, self.device, "float32")
        folder = Path(card.path)
        if not all((folder / f"{n}.pt").exists() for n in ("pnet", "rnet", "onet")):
            raise TaskError(
                f"{folder} lacks pnet.pt, rnet.pt and onet.pt; reinstall the weights: "
                f"pip install --no-deps facenet-pytorch==2.6.0"
            )
        from taskrun.pipelines.vision.mtcnn import MTCNN

        self.threads = None if os.environ.get("TASKRUN_THREADS") or self.device != "cpu" else 1
        self.model = cached_model(
            card,
            "torch",
            self.device,
            self.dtype,
            "mtcnn",
            lambda: MTCNN.from_folder(folder).to(self.device, self.torch_dtype),
        )

    def run(self, inputs, options, clock):
        several = len(inputs) > 1

        def process(batch):
            import numpy as np
            import torch

            for index, image in batch:
                x = torch.from_numpy(np.array(image)).permute(2, 0, 1).to(self.device)
                # --min-face is in the original's pixels; a large picture was decoded reduced
                min_face = max(12, round(options.min_face / max(original_scale(image))))
                boxes, points = self.model.detect(x, min_face=min_face)
                result = Result(input=inputs[index].describe(), width=image.width, height=image.height)
                for b, p in zip(boxes.tolist(), points.tolist()):
                    if b[4] >= options.threshold:
                        result.boxes.append(Box("face", b[4], *b[:4], landmarks=p if options.landmarks else None))
                yield annotate_item(index, image, to_original(result, image), options, several, inputs)

        with torch_threads(self.threads):
            yield from measured_run(inputs, options.batch_size, process, clock, "detect", Metrics)
