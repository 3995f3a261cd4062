"""Image loading, and classify/detect on tiny random vision models built in code (no real weights)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from taskrun.runner.cli import main
from taskrun.tasks.base import Input, TaskError
from taskrun.tasks.image_files import load_image
from tests.tiny.vision import CAT_SCORE, FIXED_BOX, LABELS, build_detr, build_vit, build_yolos, picture


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def job(*args):
    r = invoke(*args, "--json", "-q")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pics(tmp_path_factory):
    d = tmp_path_factory.mktemp("pics")
    return [picture(d, "wide.png", (96, 64)), picture(d, "tall.png", (40, 120)), picture(d, "square.png", (50, 50))]


# --------------------------------------------------------------------------- image loading


def _save(tmp_path, img, name, **kw):
    p = tmp_path / name
    img.save(p, **kw)
    return p


def test_modes_become_rgb_that_looks_the_same(tmp_path):
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red → white, as a viewer shows it
    assert load_image(_save(tmp_path, rgba, "a.png")).getpixel((0, 0)) == (255, 255, 255)
    grey = load_image(_save(tmp_path, Image.new("L", (4, 4), 77), "g.png"))
    assert grey.mode == "RGB" and grey.getpixel((1, 1)) == (77, 77, 77)
    pal = Image.new("P", (4, 4), 1)
    pal.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    assert load_image(_save(tmp_path, pal, "p.png")).getpixel((0, 0)) == (10, 200, 30)
    pal.info["transparency"] = 1
    assert load_image(_save(tmp_path, pal, "pt.png", transparency=1)).getpixel((0, 0)) == (255, 255, 255)
    cmyk = load_image(_save(tmp_path, Image.new("CMYK", (4, 4), (0, 255, 255, 0)), "c.jpg", quality=100))
    r, g, b = cmyk.getpixel((0, 0))
    assert r > 200 and g < 60 and b < 60  # cyan-free, full magenta + yellow = red
    wide = Image.fromarray(np.full((4, 4), 65535 // 2, dtype=np.uint16))
    p16 = _save(tmp_path, wide, "w.png")
    assert Image.open(p16).mode.startswith("I")
    assert abs(load_image(p16).getpixel((0, 0))[0] - 127) <= 1  # scaled, not clipped to white


def _png48(path, rgb16):
    """A 16-bit-per-channel RGB PNG, written by hand (Pillow cannot write one)."""
    import struct
    import zlib

    h, w, _ = rgb16.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + rgb16[y].astype(">u2").tobytes() for y in range(h))
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return path


def test_16_bit_colour_keeps_its_colours(tmp_path):
    rgb = np.zeros((3, 5, 3), dtype=np.uint16)
    rgb[..., 0], rgb[..., 2] = 65535, 32896  # full red, half blue
    loaded = load_image(_png48(tmp_path / "deep.png", rgb))
    assert loaded.mode == "RGB" and loaded.size == (5, 3)
    r, g, b = loaded.getpixel((2, 1))
    assert r == 255 and g == 0 and abs(b - 128) <= 1


def test_exif_orientation_is_applied(tmp_path):
    img = Image.new("RGB", (60, 20), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 10, 20))  # red strip on the left as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    loaded = load_image(_save(tmp_path, img, "o.jpg", exif=exif, quality=95))
    assert loaded.size == (20, 60)
    assert loaded.getpixel((10, 5))[0] > 200  # the left strip is now on top


def test_decompression_bomb_is_refused_with_the_limit(tmp_path, monkeypatch):
    p = _save(tmp_path, Image.new("RGB", (200, 100)), "big.png")
    monkeypatch.setenv("TASKRUN_MAX_PIXELS", "10000")
    with pytest.raises(TaskError, match=r"20,000 pixels, over the limit of 10,000.*TASKRUN_MAX_PIXELS"):
        load_image(p)


@pytest.mark.parametrize(
    "name,make,expect",
    [
        ("trunc.png", lambda p, src: p.write_bytes(src.read_bytes()[:200]), "damaged or cut short"),
        ("empty.png", lambda p, src: p.write_bytes(b""), "empty"),
        ("text.jpg", lambda p, src: p.write_text("not a picture"), "not an image"),
    ],
)
def test_broken_files_get_a_clear_error(tmp_path, pics, name, make, expect):
    p = tmp_path / name
    make(p, pics[0])
    with pytest.raises(TaskError, match=expect):
        load_image(p)


# --------------------------------------------------------------------------- classify


def test_tiny_vit_classifies_a_batch_and_a_folder(tiny_dir, pics):
    vit = build_vit(tiny_dir)
    out = job("classify", *pics, "-m", vit, "-k", "2", "--batch-size", "2")
    assert out["status"] == "ok" and len(out["items"]) == 3
    for i, it in enumerate(out["items"]):
        assert it["index"] == i and it["input"] == str(pics[i])
        labels = it["result"]["labels"]
        assert len(labels) == 2 and {lab["label"] for lab in labels} <= set(LABELS.values())
        assert labels[0]["score"] >= labels[1]["score"]
    m = out["metrics"]
    assert m["items"] == 3 and m["items_per_s"] > 0 and m["latency_s"] > 0
    assert not set(m) & {"input_tokens", "output_tokens", "tokens_per_s"}
    folder = job("classify", pics[0].parent, "-m", vit)
    assert len(folder["items"]) == 3 and len(folder["items"][0]["result"]["labels"]) == 3


def test_batched_scores_equal_one_at_a_time(tiny_dir, pics):
    vit = build_vit(tiny_dir)
    batched = job("classify", *pics, "-m", vit, "--batch-size", "3")
    single = job("classify", *pics, "-m", vit, "--batch-size", "1")
    for a, b in zip(batched["items"], single["items"]):
        assert [x["label"] for x in a["result"]["labels"]] == [x["label"] for x in b["result"]["labels"]]
        assert np.allclose(
            [x["score"] for x in a["result"]["labels"]], [x["score"] for x in b["result"]["labels"]], atol=1e-5
        )


def test_a_broken_image_fails_alone_and_the_exit_is_non_zero(tiny_dir, pics, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(pics[0].read_bytes()[:100])
    r = invoke("classify", pics[0], bad, pics[1], "-m", build_vit(tiny_dir), "--json", "-q")
    assert r.exit_code != 0 and "1 of 3 inputs failed" in r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "partial" and [it["index"] for it in out["items"]] == [0, 2]
    assert out["errors"][0]["index"] == 1 and "cut short" in out["errors"][0]["error"]


def test_pipeline_reports_progress_per_batch(tiny_dir, pics):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines import load_pipeline
    from taskrun.tasks import events as ev
    from taskrun.tasks.classify import Options
    from taskrun.tasks.clock import Clock

    card = resolve(str(build_vit(tiny_dir)))
    pipe = load_pipeline("classify", card, "transformers", "cpu", "auto")
    inputs = [Input(source=str(p), kind="image", path=str(p)) for p in pics]
    import torch

    with torch.inference_mode():  # the runner's job, done here by hand
        events = list(pipe.run(inputs, Options(batch_size=2), Clock()))
    assert [e.done for e in events if isinstance(e, ev.Progress)] == [2, 3]
    assert isinstance(events[-1], ev.Done) and events[-1].metrics.items == 3


def test_a_batch_that_fails_is_retried_one_image_at_a_time(pics):
    from taskrun.pipelines.vision.batching import run_batches
    from taskrun.tasks import events as ev

    def process(batch):
        if any(i == 1 for i, _ in batch):
            raise ValueError("cannot take image 1")
        for i, _ in batch:
            yield i, "ok"

    inputs = [Input(source=str(p), kind="image", path=str(p)) for p in pics]
    stats: dict = {}
    events = list(run_batches(inputs, 3, process, stats))
    assert [e.index for e in events if isinstance(e, ev.Item)] == [0, 2]
    errors = [e for e in events if isinstance(e, ev.ItemError)]
    assert len(errors) == 1 and errors[0].index == 1 and errors[0].message == "ValueError: cannot take image 1"
    assert stats["items"] == 2


def test_an_image_model_refuses_text(tiny_dir, pics):
    r = invoke("classify", "some words", "-m", build_vit(tiny_dir))
    assert r.exit_code != 0 and "is text" in r.output


# --------------------------------------------------------------------------- detect


@pytest.mark.parametrize("builder", [build_yolos, build_detr], ids=["yolos", "detr"])
def test_boxes_come_back_in_original_pixels(tiny_dir, pics, builder):
    out = job("detect", *pics, "-m", builder(tiny_dir), "--batch-size", "2")
    cx, cy, w, h = FIXED_BOX
    for it in out["items"]:
        res = it["result"]
        W, H = res["width"], res["height"]
        assert (W, H) == Image.open(it["input"]).size
        assert res["boxes"], "expected the fixed boxes"
        for b in res["boxes"]:
            assert b["label"] == "cat" and b["score"] == pytest.approx(CAT_SCORE, abs=1e-3)
            assert [b["x0"], b["y0"], b["x1"], b["y1"]] == pytest.approx(
                [(cx - w / 2) * W, (cy - h / 2) * H, (cx + w / 2) * W, (cy + h / 2) * H], abs=0.05
            )
    assert out["metrics"]["items"] == 3


@pytest.mark.parametrize("task, builder", [("classify", build_vit), ("detect", build_detr)], ids=["vit", "detr"])
def test_a_large_photo_is_decoded_no_larger_than_the_processor_resizes_to(
    tiny_dir, tmp_path, monkeypatch, task, builder
):
    """The transformers runtimes ask for their processor's size as the decode's fit (ViT's
    32x32, DETR's shortest edge 32 here): a 2000x1500 JPEG is decoded at a reduced scale, and
    detect's boxes still come back in the original's pixels."""
    from tests.process_helpers import record_decodes

    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (2000, 1500), (90, 140, 200)).save(photo, quality=90)
    decoded = record_decodes(monkeypatch)
    out = job(task, photo, "-m", builder(tiny_dir))
    assert out["metrics"]["items"] == 1
    ((fit, size),) = decoded
    assert fit == 32 and 32 <= min(size) < 64, decoded
    if task == "detect":
        res = out["items"][0]["result"]
        assert (res["width"], res["height"]) == (2000, 1500) and res["boxes"]
        assert max(b["x1"] for b in res["boxes"]) > 100  # on the original's scale, not the 50 px decode


def test_yolos_batches_of_mixed_sizes_equal_one_at_a_time(tiny_dir, pics):
    """YOLOS has no pixel mask: padding a mixed-size batch would change its boxes, so the pipeline
    batches it by size. Random heads make the boxes depend on the pixels."""
    yolos = build_yolos(tiny_dir, fixed=False)
    batched = job("detect", *pics, "-m", yolos, "-t", "0", "--batch-size", "3")
    single = job("detect", *pics, "-m", yolos, "-t", "0", "--batch-size", "1")
    for a, b in zip(batched["items"], single["items"]):
        boxes_a = [[x["x0"], x["y0"], x["x1"], x["y1"], x["score"]] for x in a["result"]["boxes"]]
        boxes_b = [[x["x0"], x["y0"], x["x1"], x["y1"], x["score"]] for x in b["result"]["boxes"]]
        assert boxes_a and np.allclose(boxes_a, boxes_b, atol=1e-3)


def test_threshold_filters_boxes(tiny_dir, pics):
    yolos = build_yolos(tiny_dir)
    assert job("detect", pics[0], "-m", yolos, "-t", "0.70")["items"][0]["result"]["boxes"]
    assert job("detect", pics[0], "-m", yolos, "-t", "0.72")["items"][0]["result"]["boxes"] == []


def test_annotate_draws_on_a_copy_per_image(tiny_dir, pics, tmp_path):
    yolos = build_yolos(tiny_dir)
    one = tmp_path / "one.png"
    out = job("detect", pics[0], "-m", yolos, "--annotate", one)
    assert out["items"][0]["result"]["annotated"] == str(one)
    drawn, orig = Image.open(one).convert("RGB"), Image.open(pics[0]).convert("RGB")
    assert drawn.size == orig.size and np.abs(np.asarray(drawn, int) - np.asarray(orig, int)).sum() > 0
    several = job("detect", *pics[:2], "-m", yolos, "--annotate", tmp_path / "many.jpg")
    names = sorted(p.name for p in tmp_path.glob("many-*.jpg"))
    assert names == ["many-1-wide.jpg", "many-2-tall.jpg"] and len(several["items"]) == 2
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_detect_refuses_what_it_cannot_do_before_loading(tiny_dir, pics, tmp_path):
    yolos = build_yolos(tiny_dir)
    r = invoke("detect", pics[0], "-m", yolos, "--landmarks")
    assert r.exit_code != 0 and "--landmarks needs a face detector" in r.output
    r = invoke("detect", pics[0], "-m", yolos, "--annotate", tmp_path / "nope" / "x.png")
    assert r.exit_code != 0 and "does not exist" in r.output
    r = invoke("detect", pics[0], "-m", yolos, "--annotate", tmp_path / "x.txt")
    assert r.exit_code != 0 and ".png" in r.output
    r = invoke("detect", pics[0], "-m", build_vit(tiny_dir))
    assert r.exit_code != 0 and "detect needs" in r.output
    r = invoke("detect", "-m", yolos, "-f", __file__)
    assert r.exit_code != 0 and "text file" in r.output


def test_tasks_and_models_list_both_tasks_and_defaults():
    tasks = invoke("tasks", "--json")
    assert tasks.exit_code == 0 and {"classify", "detect"} <= {t["task"] for t in json.loads(tasks.stdout)}
    models = invoke("models")
    assert "mtcnn" in models.output and "efficientnet-lite0" in models.output


# --------------------------------------------------------------------------- MTCNN pieces


def test_nms_keeps_the_best_of_overlapping_boxes():
    import torch

    from taskrun.pipelines.vision.mtcnn import nms

    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [2, 2, 5, 5]], dtype=torch.float)
    scores = torch.tensor([0.9, 0.95, 0.5, 0.8])
    assert nms(boxes, scores, 0.5).tolist() == [1, 3, 2]  # 0 overlaps 1 (IoU 0.68); 3 is small inside
    assert nms(boxes, scores, 0.5, mode="min").tolist() == [1, 2]  # "min" drops the nested box too
    assert nms(boxes[:0], scores[:0], 0.5).tolist() == []


@pytest.mark.real  # reads facenet_pytorch's shipped weights
def test_mtcnn_nets_match_the_shipped_state_dicts():
    from taskrun.pipelines.vision.mtcnn import MTCNN, weights_dir

    model = MTCNN.from_folder(weights_dir())  # strict: a renamed or missing layer fails here
    assert sum(p.numel() for p in model.parameters()) > 400_000


def test_a_bomb_among_good_images_fails_alone_before_loading(tiny_dir, pics, tmp_path, monkeypatch):
    big = tmp_path / "big.png"
    Image.new("RGB", (300, 300)).save(big)
    monkeypatch.setenv("TASKRUN_MAX_PIXELS", "50000")
    r = invoke("detect", pics[0], big, "-m", build_yolos(tiny_dir), "--json", "-q")
    assert r.exit_code != 0
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [it["index"] for it in out["items"]] == [0] and "decompression" in out["errors"][0]["error"]
    alone = invoke("classify", big)  # one input: refused before the default model loads
    assert alone.exit_code != 0 and "over the limit of 50,000" in alone.output
