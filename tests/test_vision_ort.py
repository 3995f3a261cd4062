"""classify's ONNX Runtime engine for EfficientNet (pipelines/vision/efficientnet_ort.py): the
export as a self-checking cache entry, the same classes as the torch runtime, the refusals, and
the batching that keeps two batches in flight. Tiny random EfficientNet-Lite0 weights built in
code; the real weights behind the `real` marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskrun.tasks import events as ev
from taskrun.tasks.base import Input
from tests.test_vision import invoke, job
from tests.tiny import models_toml_with
from tests.tiny.torch_vision import alias, build_efficientnet
from tests.tiny.vision import picture

IMAGES = Path(__file__).resolve().parent.parent / "samples" / "images"


@pytest.fixture
def tiny(tiny_dir, tmp_path, monkeypatch):
    """A tiny random EfficientNet-Lite0 whose default runtime is onnxruntime (as the packaged
    model's is), with its own empty cache folder; returns (model alias, pictures)."""
    from taskrun.pipelines import clear_cache

    clear_cache()  # a session loaded by an earlier test would skip this test's export
    entry = alias(
        "tiny-efficientnet-ort", build_efficientnet(tiny_dir), "EfficientNetLite0", "classify", "image-classification"
    )
    entry["tiny-efficientnet-ort"].update(runtime="onnxruntime", runtimes=["onnxruntime", "torch"])
    monkeypatch.setenv("TASKRUN_MODELS_TOML", str(models_toml_with(entry, tmp_path)))
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(tmp_path / "cache"))
    pics = [
        picture(tmp_path / "pics", "wide.png", (96, 64)),
        picture(tmp_path / "pics", "tall.png", (40, 120)),
        picture(tmp_path / "pics", "square.png", (50, 50)),
    ]
    return "tiny-efficientnet-ort", pics


def test_onnxruntime_is_the_default_and_gives_torch_float32_scores(tiny):
    model, pics = tiny
    ort = job("classify", *pics, "--model", model, "-k", "3", "--batch-size", "2")
    torch = job("classify", *pics, "--model", model, "-k", "3", "--runtime", "torch", "--dtype", "float32")
    assert (ort["runtime"], ort["dtype"], ort["device"]) == ("onnxruntime", "float32", "cpu")
    assert (torch["runtime"], torch["dtype"]) == ("torch", "float32")
    assert [it["input"] for it in ort["items"]] == [str(p) for p in pics]
    for a, b in zip(ort["items"], torch["items"]):
        sa = [lab["score"] for lab in a["result"]["labels"]]
        sb = [lab["score"] for lab in b["result"]["labels"]]
        assert sa == pytest.approx(sb, abs=1e-5)
    assert ort["metrics"]["items"] == 3


def test_a_large_photo_is_decoded_only_as_large_as_the_model_squeezes_it(tiny, tmp_path, monkeypatch):
    """The EfficientNet pipelines ask for their input size as the decode's fit, so a large JPEG
    is decoded at a reduced scale (not at 2048 pixels), on either runtime."""
    from PIL import Image

    from tests.process_helpers import record_decodes

    model, _ = tiny
    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (2000, 1500), (90, 140, 200)).save(photo, quality=90)
    decoded = record_decodes(monkeypatch)
    for runtime in ("onnxruntime", "torch"):
        out = job("classify", photo, "--model", model, "-k", "1", "--runtime", runtime)
        assert out["items"][0]["result"]["labels"] and out["runtime"] == runtime
    size = 224  # build_efficientnet's Lite0 input size
    assert [fit for fit, _ in decoded] == [size, size]
    assert all(size <= min(wh) < 2 * size for _, wh in decoded), decoded


def test_once_exported_a_classify_job_never_imports_torch(tiny):
    """The export needs torch once; after it a job on ONNX Runtime runs without it, the runner's
    inference mode included (importing torch cost a cold `run classify` ~1.4 s of its 1.8 s)."""
    from tests.process_helpers import cli_imports

    model, pics = tiny
    assert job("classify", pics[0], "--model", model, "-k", "1")["runtime"] == "onnxruntime"  # exports
    r, heavy = cli_imports("classify", pics[0], "--model", model, "-k", "1", "-q")
    assert "torch" not in heavy, r.stderr


def test_a_cache_that_cannot_be_written_still_classifies_from_a_temporary_export(tiny, monkeypatch):
    import glob
    import tempfile

    model, pics = tiny
    monkeypatch.setenv("TASKRUN_CACHE_DIR", "/proc/self/taskrun-cache")  # no one can create it
    before = set(glob.glob(str(Path(tempfile.gettempdir()) / "taskrun-build-*")))
    out = job("classify", pics[0], "--model", model, "-k", "1")
    assert out["runtime"] == "onnxruntime" and out["items"][0]["result"]["labels"]
    made = set(glob.glob(str(Path(tempfile.gettempdir()) / "taskrun-build-*"))) - before
    assert len(made) == 1 and list(Path(made.pop()).glob("*.onnx"))  # removed when the process exits


def test_the_export_is_a_cache_entry_made_once_and_rebuilt_when_damaged(tiny, tmp_path):
    model, pics = tiny
    out = job("classify", pics[0], "--model", model)
    entries = list((tmp_path / "cache" / "onnx-vision").iterdir())
    assert len(entries) == 1 and (entries[0] / "model.onnx").exists() and (entries[0] / "manifest.json").exists()
    logged = json.loads(invoke("logs", "show", out["id"]).stdout)
    assert any("exported to ONNX" in note for note in logged["notes"])  # what ran, in the run log
    onnx = entries[0] / "model.onnx"
    made = onnx.stat().st_mtime_ns
    job("classify", pics[0], "--model", model)
    assert onnx.stat().st_mtime_ns == made  # reused, not exported again
    listed = json.loads(invoke("cache", "list", "--json").stdout)["entries"]
    assert [e["kind"] for e in listed if e["name"].startswith("onnx-vision/")] == ["onnx"]

    from taskrun.pipelines import clear_cache

    clear_cache()  # the session is cached in-process; a new process would check the entry
    with open(onnx, "r+b") as f:  # damage it in place, keeping its size
        f.seek(onnx.stat().st_size // 2)
        f.write(b"\0" * 64)
    r = invoke("classify", pics[0], "--model", model, "--json", "-q")
    assert r.exit_code == 0, r.output
    assert "being rebuilt" in r.stderr


@pytest.mark.parametrize("option, value", [("--dtype", "bfloat16"), ("--device", "cuda")])
def test_onnxruntime_refuses_what_only_torch_does_naming_the_fix(tiny, option, value):
    model, pics = tiny
    r = invoke("classify", pics[0], "--model", model, option, value)
    assert r.exit_code != 0 and "--runtime torch" in r.output


def test_two_batches_in_flight_keep_input_order_and_a_broken_image_fails_alone(tmp_path):
    from taskrun.pipelines.vision.batching import run_batches

    pics = [picture(tmp_path, f"p{i}.png", (20 + i, 30)) for i in range(7)]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    paths = pics[:3] + [broken] + pics[3:]
    inputs = [Input(source=str(p), kind="image", path=str(p)) for p in paths]

    def process(batch):  # each image's width, as if a model had looked at it
        yield from batch

    stats: dict = {}
    events = list(run_batches(inputs, 3, process, stats, prepare=lambda img: img.width, workers=2))
    items = [e for e in events if isinstance(e, (ev.Item, ev.ItemError))]
    assert [e.index for e in items] == list(range(8))
    assert isinstance(items[3], ev.ItemError) and "broken.png" in items[3].source
    assert [e.result for e in items if isinstance(e, ev.Item)] == [20, 21, 22, 23, 24, 25, 26]
    assert [e.done for e in events if isinstance(e, ev.Progress)] == [3, 6, 8]
    assert stats["items"] == 7


@pytest.mark.real
def test_default_runtime_keeps_the_top1_of_torch_float32_on_every_photo():
    photos = sorted(IMAGES.glob("*.jpg"))
    ort = job("classify", *photos, "-k", "1")
    torch = job("classify", *photos, "-k", "1", "--runtime", "torch", "--dtype", "float32")
    assert (ort["runtime"], ort["dtype"]) == ("onnxruntime", "float32")
    for a, b in zip(ort["items"], torch["items"]):
        assert a["result"]["labels"][0]["label"] == b["result"]["labels"][0]["label"]
        assert a["result"]["labels"][0]["score"] == pytest.approx(b["result"]["labels"][0]["score"], abs=1e-4)
