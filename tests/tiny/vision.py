"""Tiny random vision models of the real architectures (ViT classifier, YOLOS and DETR detectors),
built in code and saved as HF folders with their image processors; plus small test pictures.
No timm and no torchvision: DETR gets a tiny transformers ResNet backbone instead of timm's.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny import done, once

LABELS = {0: "cat", 1: "dog", 2: "car"}

# The detectors' output heads are fixed so every query predicts the same known box and class:
# centre (0.5, 0.4), size (0.5, 0.2) of the image, "cat" with probability e²/(e²+3) ≈ 0.711
# (softmax over 3 labels + no-object). Tests can then check exact pixels after post-processing.
FIXED_BOX = (0.5, 0.4, 0.5, 0.2)  # cx, cy, w, h, relative
CAT_SCORE = 0.7113


def _fix_heads(model) -> None:
    import torch

    cls = model.class_labels_classifier
    last_cls = cls.layers[-1] if hasattr(cls, "layers") else cls
    box = model.bbox_predictor.layers[-1]
    with torch.no_grad():
        last_cls.weight.zero_()
        last_cls.bias.zero_()
        last_cls.bias[0] = 2.0
        box.weight.zero_()
        box.bias.copy_(torch.logit(torch.tensor(FIXED_BOX)))


def _labels():
    return {"id2label": dict(LABELS), "label2id": {v: k for k, v in LABELS.items()}}


def build_vit(root: Path) -> Path:
    folder, ready = once(root, "tiny-vit")
    if ready:
        return folder
    import torch
    from transformers import ViTConfig, ViTForImageClassification
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=len(LABELS),
        **_labels(),
    )
    ViTForImageClassification(cfg).eval().save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    done(folder)
    return folder


def build_yolos(root: Path, fixed: bool = True) -> Path:
    """``fixed=False`` keeps the random output heads: outputs then depend on the pixels."""
    folder, ready = once(root, "tiny-yolos" if fixed else "tiny-yolos-random")
    if ready:
        return folder
    import torch
    from transformers import YolosConfig, YolosForObjectDetection
    from transformers.models.yolos.image_processing_pil_yolos import YolosImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = YolosConfig(
        image_size=[32, 32],
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_detection_tokens=6,
        num_labels=len(LABELS),
        **_labels(),
    )
    model = YolosForObjectDetection(cfg).eval()
    if fixed:
        _fix_heads(model)
    model.save_pretrained(folder)
    YolosImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(folder)
    done(folder)
    return folder


def build_detr(root: Path) -> Path:
    folder, ready = once(root, "tiny-detr")
    if ready:
        return folder
    import torch
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig
    from transformers.models.detr.image_processing_pil_detr import DetrImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    backbone = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", out_features=["stage2"]
    )
    cfg = DetrConfig(
        use_timm_backbone=False,
        backbone_config=backbone,
        use_pretrained_backbone=False,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=6,
        num_labels=len(LABELS),
        **_labels(),
    )
    model = DetrForObjectDetection(cfg).eval()
    _fix_heads(model)
    model.save_pretrained(folder)
    DetrImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(folder)
    done(folder)
    return folder


def picture(folder: Path, name: str = "shapes.png", size: tuple[int, int] = (96, 64)) -> Path:
    """A small real PNG (a red box on a blue background)."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.exists():
        img = Image.new("RGB", size, (30, 60, 200))
        ImageDraw.Draw(img).rectangle([size[0] // 4, size[1] // 4, size[0] // 2, size[1] // 2], fill=(220, 20, 20))
        img.save(path)
    return path
