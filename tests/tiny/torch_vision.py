"""The plain-torch vision runtimes' models with random weights, built in code: EfficientNet-Lite0
(the network of efficientnet_lite_pytorch, the code package the default model uses) and the three
MTCNN nets taskrun rebuilds in torch. No weights package is read."""

from __future__ import annotations

from pathlib import Path

from tests.tiny import done, once


def build_efficientnet(root: Path) -> Path:
    """A random EfficientNet-Lite0 state dict, saved as the .pth file the torch runtime loads."""
    folder, ready = once(root, "tiny-efficientnet")
    weights = folder / "efficientnet-lite0.pth"
    if ready:
        return weights
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save(EfficientNet.from_name("efficientnet-lite0").state_dict(), weights)
    done(folder)
    return weights


def build_mtcnn(root: Path) -> Path:
    """Random P-, R- and O-nets saved as pnet.pt, rnet.pt, onet.pt, as facenet-pytorch ships them."""
    folder, ready = once(root, "tiny-mtcnn")
    if ready:
        return folder
    import torch

    from taskrun.pipelines.vision.mtcnn import MTCNN

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = MTCNN()
    for name in ("pnet", "rnet", "onet"):
        torch.save(getattr(model, name).state_dict(), folder / f"{name}.pt")
    done(folder)
    return folder


def alias(name: str, path: Path, architecture: str, task: str, kind: str) -> dict:
    """A models.toml entry for a local torch model: a bare state dict does not say what it is."""
    return {
        name: {
            "local": str(path),
            "architecture": architecture,
            "runtime": "torch",
            "runtimes": ["torch"],
            "tasks": [task],
            "kind": kind,
        }
    }
