"""classify and detect on the real packaged weights (EfficientNet-Lite0, MTCNN) and real photos
(scikit-image's sample photos, saved in samples/images)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main

pytestmark = pytest.mark.real
IMAGES = Path(__file__).resolve().parent.parent / "samples" / "images"
CATS = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}
ASTRONAUT_FACE = (181, 62, 268, 172)  # facenet-pytorch's own MTCNN on skimage's astronaut (MODELS.md)


def job(*args):
    r = CliRunner().invoke(main, [str(a) for a in args] + ["--json", "-q"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def labels(item):
    return [lab["label"] for lab in item["result"]["labels"]]


def test_cat_and_coffee_photos_get_the_right_imagenet_classes():
    out = job("classify", IMAGES / "cat.jpg", IMAGES / "coffee.jpg")
    assert out["model"]["name"] == "efficientnet-lite0" and out["runtime"] == "onnxruntime"
    cat, coffee = out["items"]
    assert set(labels(cat)) & CATS and labels(cat)[0] in CATS
    assert labels(coffee)[0] in {"espresso", "cup"}
    assert cat["result"]["labels"][0]["score"] > 0.5
    assert set(out["metrics"]) >= {"items", "items_per_s", "latency_s", "load_s", "wall_s"}


def test_torch_auto_dtype_keeps_top1_of_float32_on_every_photo():
    photos = sorted(IMAGES.glob("*.jpg"))
    auto = job("classify", *photos, "--runtime", "torch")
    fp32 = job("classify", *photos, "--runtime", "torch", "--dtype", "float32")
    assert fp32["dtype"] == "float32"
    assert [labels(a)[0] for a in auto["items"]] == [labels(f)[0] for f in fp32["items"]]
    for a, f in zip(auto["items"], fp32["items"]):
        assert abs(a["result"]["labels"][0]["score"] - f["result"]["labels"][0]["score"]) < 0.05


def test_batch_of_sixteen_equals_one_at_a_time_in_float32():
    photos = sorted(IMAGES.glob("*.jpg")) * 4
    batched = job("classify", *photos, "--dtype", "float32", "--batch-size", "16", "-k", "1")
    single = job("classify", *photos[:4], "--dtype", "float32", "--batch-size", "1", "-k", "1")
    for a, b in zip(batched["items"][:4], single["items"]):
        assert labels(a) == labels(b)
        assert a["result"]["labels"][0]["score"] == pytest.approx(b["result"]["labels"][0]["score"], abs=1e-4)
    assert batched["metrics"]["items"] == 16


def test_astronaut_has_one_face_where_her_face_is_and_the_rocket_none(tmp_path):
    out = job(
        "detect", IMAGES / "astronaut.jpg", IMAGES / "rocket.jpg", "--landmarks", "--annotate", tmp_path / "faces.png"
    )
    assert out["model"]["name"] == "mtcnn"
    astronaut, rocket = out["items"]
    faces = astronaut["result"]["boxes"]
    assert len(faces) == 1 and faces[0]["label"] == "face" and faces[0]["score"] > 0.99
    box = (faces[0]["x0"], faces[0]["y0"], faces[0]["x1"], faces[0]["y1"])
    assert iou(box, ASTRONAUT_FACE) > 0.8, box
    eyes = faces[0]["landmarks"][:2]  # left eye left of right eye, both inside the box, above the nose
    assert eyes[0][0] < eyes[1][0] and all(box[0] < x < box[2] and box[1] < y < box[3] for x, y in eyes)
    assert eyes[0][1] < faces[0]["landmarks"][2][1]
    assert rocket["result"]["boxes"] == []
    assert (tmp_path / "faces-1-astronaut.png").exists() and (tmp_path / "faces-2-rocket.png").exists()


def test_cat_and_coffee_have_no_human_face():
    out = job("detect", IMAGES / "cat.jpg", IMAGES / "coffee.jpg")
    assert [it["result"]["boxes"] for it in out["items"]] == [[], []]


def test_folding_batch_norm_into_the_convs_changes_nothing():
    import torch

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.vision.efficientnet import build_model, fuse_for_inference, preprocess
    from taskrun.tasks.image_files import load_image

    card = resolve("efficientnet-lite0")
    x = torch.stack([torch.from_numpy(preprocess(load_image(f), 224)) for f in sorted(IMAGES.glob("*.jpg"))])
    plain = build_model(card.architecture, card.path)
    fused = fuse_for_inference(build_model(card.architecture, card.path))
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    with torch.inference_mode():
        assert torch.allclose(plain(x).softmax(-1), fused(x).softmax(-1), atol=1e-5)
