"""`run bench classify` and its references: ONNX Runtime
float32 at batch 16 and the plain torch loop, on the same EfficientNet-Lite0 weights, the same
photos and the same PIL preprocessing, and the top-1 agreement between contenders.
benchmarks/bench_vision.py builds on the same loops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taskrun.runner.bench.core import Contender
from taskrun.runner.bench.suites import Suite, file_inputs, missing, offer, taskrun_job
from taskrun.tasks.base import TaskError

ROOT = Path(__file__).resolve().parents[2]  # the source checkout (samples/ lives there)
SAMPLES = ROOT / "samples"


def photos(n: int) -> list[Path]:
    """``n`` photos: the checkout's sample photos, repeated."""
    files = sorted((SAMPLES / "images").glob("*.jpg"))
    if not files:
        raise TaskError(f"no sample photos in {SAMPLES / 'images'}; pass --input PHOTO (repeatable)")
    return [files[i % len(files)] for i in range(n)]


def reference_model(path: str):
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name("efficientnet-lite0")
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()


def reference_loop(model, files) -> list[int]:
    """The plain loop: one image at a time, float32, NCHW; the top-1 class index of each."""
    import numpy as np
    import torch
    from PIL import Image

    top1 = []
    with torch.inference_mode():
        for f in files:
            img = Image.open(f).convert("RGB").resize((224, 224), Image.BILINEAR)
            x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)
            top1.append(int(model(x.unsqueeze(0))[0].argmax()))
    return top1


def torch_loop_run(model: str, files: list[Path]):
    def load():
        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads

        configure_threads()
        net = reference_model(resolve(model).path)
        return lambda: reference_loop(net, files)

    return load


def export_reference_onnx(path: str, dst: Path) -> Path:
    """The model exported the way its user would: float32 NCHW input, batch dimension free."""
    import warnings

    import torch

    net = reference_model(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.zeros(1, 3, 224, 224),),
            str(dst),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    return dst


def ort_loop(session, files, batch: int = 16) -> list[int]:
    """ONNX Runtime as its user writes it: per batch, each image opened, resized and scaled with
    PIL and numpy exactly as reference_loop does, then one run; the top-1 class index of each."""
    import numpy as np
    from PIL import Image

    top1 = []
    for start in range(0, len(files), batch):
        xs = []
        for f in files[start : start + batch]:
            img = Image.open(f).convert("RGB").resize((224, 224), Image.BILINEAR)
            xs.append((np.asarray(img, dtype=np.float32) / 127.5 - 1.0).transpose(2, 0, 1))
        logits = session.run(None, {"input": np.stack(xs)})[0]
        top1 += [int(i) for i in logits.argmax(1)]
    return top1


def ort_loop_run(model: str, files: list[Path]):
    def load():
        import tempfile

        import onnxruntime as ort

        import taskrun.pipelines  # noqa: F401  (first: it turns off onnxruntime's ~/.cache writes)
        from taskrun.models.resolve import resolve

        with tempfile.TemporaryDirectory(prefix="taskrun-bench-onnx-") as tmp:
            onnx_file = export_reference_onnx(resolve(model).path, Path(tmp) / "model.onnx")
            session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        return lambda: ort_loop(session, files)

    return load


def top1_agreement(outs: dict[str, Any]) -> dict:
    from taskrun.pipelines.vision.efficientnet import imagenet_labels

    ours, names = outs.get("taskrun"), imagenet_labels()
    if ours is None:
        return {}

    def top1(o) -> list[str]:  # a taskrun job's record, or a reference's class indices
        return [r.labels[0].label for r in o.results] if hasattr(o, "results") else [names[i] for i in o]

    labels = top1(ours)
    return {
        name: {"top1_agreement_with_taskrun": round(sum(a == b for a, b in zip(top1(o), labels)) / len(labels), 4)}
        for name, o in outs.items()
        if name != "taskrun"
    }


def classify(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun classify (batch 16, default runtime and dtype; and on its torch runtime) against
    ONNX Runtime float32 at batch 16 on the same weights (exported to ONNX for the run) and the
    plain torch loop from the model's README, both with the same PIL preprocessing; quality:
    top-1 agreement with taskrun."""
    model = model or "efficientnet-lite0"
    files = data or photos(16 if quick else 64)
    inputs = file_inputs(files, "image")
    opts = {"batch_size": 16, "top_k": 1}
    suite = Suite(
        "classify",
        model,
        "images",
        len(files),
        [
            Contender(
                "taskrun",
                taskrun_job("classify", inputs, opts, model),
                "taskrun",
                "batch 16, default runtime and dtype",
            )
        ],
    )
    if _torch_runtime_is_not_default(model):
        suite.contenders.append(
            Contender(
                "taskrun --runtime torch",
                taskrun_job("classify", inputs, opts, model, runtime="torch"),
                "taskrun",
                "batch 16, torch module, default dtype",
            )
        )
    plain = model == "efficientnet-lite0" and not missing("efficientnet_lite_pytorch")
    no_ort = not plain or missing("onnxruntime") or missing("onnx")
    offer(
        suite,
        against,
        "onnxruntime",
        "the ONNX Runtime reference is written for efficientnet-lite0 and needs onnxruntime and onnx "
        "(pip install onnx) for the export"
        if no_ort
        else None,
        lambda: Contender(
            "onnxruntime", ort_loop_run(model, files), note="PIL resize, float32, batch 16, default session"
        ),
    )
    offer(
        suite,
        against,
        "torch loop",
        None if plain else "the plain torch loop is written for efficientnet-lite0 (efficientnet-lite-pytorch)",
        lambda: Contender("torch loop", torch_loop_run(model, files), note="PIL resize, float32, batch 1"),
    )
    suite.quality = top1_agreement
    return suite


def _torch_runtime_is_not_default(model: str) -> bool:
    from taskrun.models.resolve import resolve

    card = resolve(model)
    return card.runtime != "torch" and "torch" in card.runtimes
