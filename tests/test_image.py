"""image: tiny random text-to-image and unconditional models built in code, the real digits model
behind the `real` marker."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, TaskError
from taskrun.tasks.clock import Clock
from taskrun.tasks.image import Options, read_png_settings
from taskrun.tasks.image_conditioning import ModelConditioning, read_conditioning
from tests.tiny.sd import build as build_sd

TOKEN_WORDS = ("token", "ttft", "prefill")


@pytest.fixture(scope="session")
def sd(tiny_dir):
    return build_sd(tiny_dir)


@pytest.fixture(scope="session")
def uncond(tiny_dir):
    """A tiny unconditional DDPM folder (no text, no classes)."""
    folder = tiny_dir / "tiny-ddpm"
    if not (folder / "model_index.json").exists():
        import torch
        from diffusers import DDIMScheduler, DDPMPipeline, UNet2DModel

        torch.manual_seed(0)
        unet = UNet2DModel(
            sample_size=8,
            in_channels=1,
            out_channels=1,
            block_out_channels=(8, 16),
            layers_per_block=1,
            norm_num_groups=4,
            down_block_types=("DownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D",) * 2,
        )
        DDPMPipeline(unet=unet, scheduler=DDIMScheduler()).save_pretrained(folder)
    return folder


def pipeline(path):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.diffusion.image import DiffusionPipeline as Pipeline

    return Pipeline(resolve(str(path)), device="cpu")


def text(prompt):
    return [Input(source="argument 1", kind="text", text=prompt)]


def run_events(pipe, inputs, **opts):
    import torch

    with torch.inference_mode():
        return list(pipe.run(inputs, Options(**opts), Clock()))


def invoke(*args):
    return CliRunner().invoke(main, ["image", *map(str, args)], catch_exceptions=False)


# --------------------------------------------------------------------------- tiny text-to-image


def test_step_event_per_denoising_step_and_metrics_add_up(sd):
    pipe = pipeline(sd)
    t = time.perf_counter()
    events = run_events(pipe, text("a red fox"), steps=4, seed=3, n=2)
    wall = time.perf_counter() - t
    steps = [e for e in events if isinstance(e, ev.Step)]
    assert [s.step for s in steps] == [1, 2, 3, 4] and {s.total for s in steps} == {4}
    assert all(s.seconds > 0 for s in steps)
    m = events[-1].metrics
    assert isinstance(events[-1], ev.Done) and m.steps == 4 and m.images == 2
    assert m.encode_s > 0 and m.decode_s > 0 and m.s_per_step > 0
    assert m.encode_s + m.steps * m.s_per_step + m.decode_s <= wall
    assert sum(s.seconds for s in steps) == pytest.approx(m.steps * m.s_per_step, rel=1e-6)
    (item,) = [e for e in events if isinstance(e, ev.Item)]
    assert [im.seed for im in item.result.images] == [3, 4]
    assert item.result.images[0].pixels.shape == (32, 32, 3)


def test_same_seed_same_pixels_other_seed_other_pixels(sd):
    pipe = pipeline(sd)

    def pixels(seed, **kw):
        events = run_events(pipe, text("a red fox"), steps=3, seed=seed, **kw)
        return [e for e in events if isinstance(e, ev.Item)][0].result.images[0].pixels

    a, b, c = pixels(7), pixels(7), pixels(8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, pixels(7, guidance=3.0))


def test_png_metadata_round_trips_and_n_images_are_numbered(sd, tmp_path):
    out = tmp_path / "fox.png"
    r = invoke(
        "a red fox",
        "--model",
        sd,
        "--steps",
        2,
        "--seed",
        11,
        "-n",
        2,
        "--negative",
        "blurry",
        "--guidance",
        4.5,
        "--scheduler",
        "euler",
        "-o",
        out,
        "-q",
    )
    assert r.exit_code == 0, r.output
    files = sorted(tmp_path.glob("*.png"))
    assert [f.name for f in files] == ["fox-1.png", "fox-2.png"]
    assert r.stdout.split() == [str(f) for f in files]
    meta = read_png_settings(files[1])
    assert meta["prompt"] == "a red fox" and meta["negative"] == "blurry" and meta["seed"] == "12"
    assert meta["steps"] == "2" and meta["guidance"] == "4.5" and meta["size"] == "32x32"
    assert meta["scheduler"] == "EulerDiscreteScheduler" and meta["model_digest"].startswith("sha256:")
    # the file says how to make it again: same settings → the same pixels
    again = tmp_path / "again.png"
    r = invoke(
        meta["prompt"],
        "--model",
        sd,
        "--steps",
        meta["steps"],
        "--seed",
        meta["seed"],
        "--negative",
        meta["negative"],
        "--guidance",
        meta["guidance"],
        "--scheduler",
        "euler",
        "-o",
        again,
        "-q",
    )
    assert r.exit_code == 0, r.output
    from PIL import Image

    assert np.array_equal(np.asarray(Image.open(files[1])), np.asarray(Image.open(again)))


def test_without_o_images_go_to_out_dir_named_from_prompt_and_seed(sd, tmp_path):
    r = invoke("A red fox!", "--model", sd, "--steps", 1, "--seed", 5, "--out-dir", tmp_path, "-q")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(tmp_path / "a-red-fox-5.png")
    r = invoke("A red fox!", "--model", sd, "--steps", 1, "--seed", 5, "--out-dir", tmp_path, "-q")
    assert r.stdout.strip() == str(tmp_path / "a-red-fox-5-2.png")  # never overwrites


def test_json_has_no_token_fields(sd, tmp_path):
    r = invoke("a cat", "--model", sd, "--steps", 1, "--seed", 0, "--json", "-q")
    assert r.exit_code == 0, r.output
    job = json.loads(r.stdout)
    keys = set(job["metrics"]) | set(job["items"][0]["result"])
    assert not [k for k in keys if any(w in k for w in TOKEN_WORDS)]
    from taskrun.tasks.image import Generation, Image, Metrics

    for cls in (Metrics, Generation, Image):
        assert not [f.name for f in dataclasses.fields(cls) if any(w in f.name for w in TOKEN_WORDS)]
    assert {"s_per_step", "encode_s", "decode_s", "images_per_s", "width", "height"} <= set(job["metrics"])


# --------------------------------------------------------------------------- refusals


@pytest.fixture
def no_loading(monkeypatch):
    """Refusals must happen before any weights load."""
    from taskrun import pipelines

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(pipelines, "load_pipeline", boom)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--label", "3"], "--label is for class-conditional models; `.*` takes a text prompt"),
        (["--steps", "0"], "--steps must be between 1 and 1000"),
        (["-n", "0"], "-n must be between 1 and 64"),
        (["--size", "33x32"], "multiples of 2 .*e.g. 32x32"),
        (["--size", "9000x9000"], "out of range"),
        (["--size", "2048x32"], "at most 4 times that per side"),  # issue 33: 4x the native size
        (["--size", "big"], "WIDTHxHEIGHT"),
        (["-o", "no/such/folder/x.png"], "does not exist; create it first"),
        (["--out-dir", "no/such/folder"], "does not exist; create it first"),
    ],
)
def test_bad_input_on_text_model_is_one_line_error_and_no_files(sd, tmp_path, monkeypatch, no_loading, args, message):
    monkeypatch.chdir(tmp_path)
    r = invoke("a red fox", "--model", sd, *args)
    assert r.exit_code != 0
    import re

    assert re.search(message, r.output), r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*.png"))


def test_unconditional_model_refuses_prompt_label_and_guidance(uncond, no_loading):
    for args, says in [
        (["a cat"], "unconditional image model: no prompt and no label"),
        (["--label", "1"], "unconditional"),
        (["--guidance", "2"], "no classifier-free guidance; drop --guidance"),
    ]:
        r = invoke(*args, "--model", uncond)
        assert r.exit_code != 0 and says in r.output, r.output


def test_unconditional_model_runs_with_no_input(uncond, tmp_path):
    r = invoke("--model", uncond, "--steps", 2, "--seed", 1, "-o", tmp_path / "u.png", "-q")
    assert r.exit_code == 0, r.output
    assert read_png_settings(tmp_path / "u.png")["size"] == "8x8"


def test_conditioning_is_read_from_config_files(sd, uncond):
    c = read_conditioning(sd)
    assert (c.kind, c.cfg, c.factor, c.native) == ("text", True, 2, (32, 32))
    c = read_conditioning(uncond)
    assert (c.kind, c.cfg, c.factor) == ("none", False, 2)


def test_prompt_to_label_rule():
    c = ModelConditioning("class", labels=tuple("0123456789"), aliases=(("seven", "7"), ("three", "3")))
    assert c.label_from_prompt("a handwritten 7") == "7"
    assert c.label_from_prompt("Seven, please") == "7"
    with pytest.raises(TaskError, match="names no class.*0, 1, 2"):
        c.label_from_prompt("a cat")
    with pytest.raises(TaskError, match="names 2 classes"):
        c.label_from_prompt("a 7 next to a 3")
    with pytest.raises(TaskError, match="no label '12'"):
        c.label_index("12")
    with pytest.raises(TaskError):  # a digit inside a number does not count
        c.label_from_prompt("room 217")


# --------------------------------------------------------------------------- the real digits model


def digit_classifier():
    """An SVC trained on the real scikit-learn digits (8×8, values 0–16), separate from the model."""
    from sklearn.datasets import load_digits
    from sklearn.svm import SVC

    d = load_digits()
    return SVC(gamma=0.001, C=10).fit(d.data, d.target)


def as_digits(pixels):
    return (np.stack([p[..., 0] for p in pixels]).astype(np.float32) / 255 * 16).reshape(len(pixels), -1)


@pytest.mark.real
def test_digits_model_refuses_before_loading(no_loading):
    for args, says in [
        (["a cat"], "names no class; this class-conditional model draws one of: 0, 1, 2"),
        ([], "say what to draw with --label"),
        (["--label", "x"], "no label 'x'"),
        (["a 3", "--label", "4"], "the prompt names 3 but --label says 4"),
        (["--label", "3", "--negative", "blurry"], "--negative needs a text-to-image model"),
        (["--label", "3", "--size", "9x8"], "multiples of 2"),
    ]:
        r = invoke(*args)
        assert r.exit_code != 0 and says in r.output, (args, r.output)


@pytest.mark.real
def test_digits_quality_100_generated_digits_recognised(tmp_path):
    pipe = pipeline("digits-ddpm")
    clf = digit_classifier()
    correct = 0
    for digit in range(10):
        events = run_events(pipe, [], label=str(digit), n=10, seed=1000 + 10 * digit)
        gen = [e for e in events if isinstance(e, ev.Item)][0].result
        correct += int((clf.predict(as_digits([im.pixels for im in gen.images])) == digit).sum())
    print(f"digits-ddpm: {correct}/100 generated digits recognised as the requested class")
    assert correct >= 80


@pytest.mark.real
def test_run_image_label_7_draws_a_seven_and_prompt_maps_to_label(tmp_path):
    from PIL import Image

    r = invoke("--label", "7", "--seed", 4, "-n", 4, "-o", tmp_path / "seven.png", "-q")
    assert r.exit_code == 0, r.output
    files = [tmp_path / f"seven-{i}.png" for i in range(1, 5)]
    pixels = [np.asarray(Image.open(f))[..., None] for f in files]
    assert (digit_classifier().predict(as_digits(pixels)) == 7).sum() >= 3
    meta = read_png_settings(files[0])
    assert meta["label"] == "7" and meta["model"] == "digits-ddpm" and meta["size"] == "8x8"
    r = invoke("a handwritten 7", "--seed", 4, "-n", 4, "-o", tmp_path / "prompt.png", "-q")
    assert r.exit_code == 0, r.output
    assert np.array_equal(np.asarray(Image.open(files[0])), np.asarray(Image.open(tmp_path / "prompt-1.png")))


def fresh_pipeline(path):
    """A pipeline whose model is loaded anew: traced graphs live with the cached model."""
    from taskrun.pipelines import clear_cache

    clear_cache()
    return pipeline(path)


def test_second_job_of_a_shape_traces_the_unet_with_identical_pixels(uncond):
    pipe = fresh_pipeline(uncond)
    jobs = [run_events(pipe, [], steps=3, seed=9, n=2) for _ in range(3)]
    compile_s = [j[-1].metrics.compile_s for j in jobs]
    assert compile_s[0] == 0 and compile_s[1] > 0 and compile_s[2] == 0  # traced once, then reused
    pixels = [[e for e in j if isinstance(e, ev.Item)][0].result.images[1].pixels for j in jobs]
    assert np.array_equal(pixels[0], pixels[1]) and np.array_equal(pixels[0], pixels[2])


def test_text_to_image_second_job_traces_the_unet_steps_and_pixels_unchanged(sd):
    pipe = fresh_pipeline(sd)
    jobs, walls = [], []
    for _ in range(3):
        t = time.perf_counter()
        jobs.append(run_events(pipe, text("a red fox"), steps=3, seed=2))
        walls.append(time.perf_counter() - t)
    metrics = [j[-1].metrics for j in jobs]
    assert metrics[0].compile_s == 0 and metrics[1].compile_s > 0 and metrics[2].compile_s == 0
    for j, m, wall in zip(jobs, metrics, walls):
        assert [e.step for e in j if isinstance(e, ev.Step)] == [1, 2, 3]
        assert m.encode_s > 0 and m.encode_s + m.steps * m.s_per_step + m.decode_s + m.compile_s <= wall
    pixels = [[e for e in j if isinstance(e, ev.Item)][0].result.images[0].pixels for j in jobs]
    assert np.array_equal(pixels[0], pixels[1]) and np.array_equal(pixels[0], pixels[2])
    assert "forward" not in pipe.pipe.unet.__dict__  # the override is gone after the job


@pytest.mark.real
def test_training_script_is_reproducible(tmp_path):
    """Same seed, torch and thread count → bit-identical weights (a short run of the real script)."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "tools" / "train_digits.py"
    for name in ("a", "b"):
        subprocess.run(
            [sys.executable, str(script), "--steps", "5", "--batch", "32", "--out", str(tmp_path / name)],
            check=True,
            capture_output=True,
        )
    weights = [(tmp_path / n / "unet" / "diffusion_pytorch_model.safetensors").read_bytes() for n in "ab"]
    assert weights[0] == weights[1]
    assert json.loads((tmp_path / "a" / "conditioning.json").read_text())["null_class"] == 10
