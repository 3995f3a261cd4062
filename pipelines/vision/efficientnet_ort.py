"""classify on ONNX Runtime: the same EfficientNet weights, exported once to ONNX and run there.

On a CPU without bf16 instructions ONNX Runtime runs this network about twice as fast as torch in
float32 (its NCHWc convolution kernels; measured on 2 AVX2 cores: 6.2 ms vs 15 ms per image at
batch 16), so it is the default classify runtime for EfficientNet; ``--runtime torch`` still
picks the torch module (and bf16 where the CPU has it).

The export (torch.onnx, once per weights digest) is a self-checking cache entry under
``onnx-vision/`` in taskrun's cache folder (models/cache_entry.py): damaged, it is rebuilt. The
exported graph takes the resized picture as it comes from PIL, uint8 HWC, and does the scaling
to [-1, 1] and the NHWC→NCHW transpose itself: the same float32 ops as ``preprocess``, in one
pass inside the runtime instead of three numpy passes on the decode thread.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import cpu_threads, require_cpu_float32
from taskrun.pipelines.vision.efficientnet import (
    EfficientNetBase,
    build_model,
    model_name,
    resized,
)
from taskrun.tasks.base import TaskError

FILE = "model.onnx"
OPSET = 17


def export(card, dst: Path, size: int) -> Path:
    """Write ``dst``: the network of ``card`` taking uint8 pixels (N, size, size, 3), giving logits."""
    import importlib.util

    if importlib.util.find_spec("onnx") is None:
        raise TaskError(
            f"the onnxruntime runtime exports {card.name} to ONNX once, which needs the `onnx` "
            f"package: pip install onnx (or use --runtime torch)"
        )
    import torch

    net = _FromPixels(build_model(card.architecture, card.path)).eval()
    example = torch.zeros(1, size, size, 3, dtype=torch.uint8)
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notes: nothing to act on
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (example,),
            str(dst),
            input_names=["pixels"],
            output_names=["logits"],
            dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    return dst


def _FromPixels(net):
    import torch

    class FromPixels(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.net = inner

        def forward(self, pixels):  # the float32 ops of efficientnet.preprocess, in the graph
            return self.net(pixels.permute(0, 3, 1, 2).float() / 127.5 - 1.0)

    return FromPixels(net)


def onnx_file(card, size: int) -> Path:
    """The exported model of ``card`` in taskrun's cache, exported on first use."""
    from taskrun.models import cache_entry
    from taskrun.models.resolve import cache_dir

    key = card.digest.split(":")[-1][:16]
    target = cache_dir() / "onnx-vision" / f"{model_name(card.architecture)}-{size}-{key}"
    folder = cache_entry.build_or_temp(
        target, card, "the torch weights, exported to ONNX", lambda tmp: export(card, tmp / FILE, size)
    )
    return folder / FILE


def session(path: Path, threads: int):
    """An ONNX Runtime CPU session with every graph optimisation (BN folding, NCHWc layouts)."""
    from taskrun.pipelines.device import configure_openmp

    configure_openmp()
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # The decode threads share the cores with the model: a spinning ORT worker would steal them.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class EfficientNetOrtPipeline(EfficientNetBase):
    runtime = "onnxruntime"

    def __init__(self, card, device="auto", dtype="auto"):
        require_cpu_float32("the onnxruntime runtime for classify", device, dtype, "torch")
        self.card = card
        self.device, self.dtype = "cpu", "float32"
        if card.kind != self.kind:
            raise TaskError(
                f"the onnxruntime runtime for classify {self.runs}; `{card.name}` is "
                f"{card.kind or card.architecture}: use --runtime transformers"
            )
        model_name(card.architecture)
        from taskrun.pipelines.vision.efficientnet import imagenet_labels

        self.id2label = dict(enumerate(imagenet_labels()))
        self.size = int(card.extra.get("image_size") or 0) or _known_size(card.architecture)
        cores = cpu_threads()
        self.workers = 2 if cores >= 2 else 1  # two batches at once, each on half the cores
        self.session = cached_model(
            card,
            self.runtime,
            self.device,
            self.dtype,
            f"efficientnet/{self.workers}",
            lambda: session(onnx_file(card, self.size), max(1, cores // self.workers)),
        )

    def prepare(self, image) -> np.ndarray:
        return np.asarray(resized(image, self.size))  # uint8 HWC: the graph scales it

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"pixels": x})[0]


# The networks' own input sizes (efficientnet_lite_pytorch's table), so a cached export runs
# without importing torch.
_SIZES = {
    "lite0": 224,
    "lite1": 240,
    "lite2": 260,
    "lite3": 280,
    "lite4": 300,
    "b0": 224,
    "b1": 240,
    "b2": 260,
    "b3": 300,
    "b4": 380,
    "b5": 456,
    "b6": 528,
    "b7": 600,
}


def _known_size(architecture: str) -> int:
    return _SIZES[model_name(architecture).split("-")[1]]
