"""embed on its two text-encoder runtimes: transformers, and ONNX Runtime on a cached ONNX export.

Fast: the tiny random BERT on both runtimes gives the same vectors, the run log records the runtime
and dtype that ran, the export is a cache entry `run cache` knows, and the default runtime is
chosen by the CPU (ONNX Runtime float32 without bf16 units, transformers where bf16 is fast).
Real: all-MiniLM-L6-v2 on ONNX Runtime against sentence-transformers float32."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

import taskrun.pipelines as pipelines
from taskrun.pipelines.text import encoder
from taskrun.runner.cli import main
from tests.tiny.bert import build as tiny_bert

TEXTS = ["the cat", "a dog barks", "stock prices fell", "the kitten and the dog " * 20]
ORT = pipelines._P + "text.ort_encoder:OrtTextEncoder"
ROWS = {
    ("embed", "onnxruntime"): pipelines.Runtime(pipelines._P + "text.embed:EmbedPipeline", engine=ORT),
    ("search", "onnxruntime"): pipelines.Runtime(pipelines._P + "text.search:SearchPipeline", engine=ORT),
}

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(autouse=True)
def ort_rows(monkeypatch):
    """The onnxruntime rows of the RUNTIMES table (already there once the table lists them)."""
    for key, row in ROWS.items():
        if key not in pipelines.RUNTIMES:
            monkeypatch.setitem(pipelines.RUNTIMES, key, row)


@pytest.fixture(scope="module")
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


def embed(*args) -> tuple[np.ndarray, dict]:
    r = CliRunner().invoke(main, ["embed", *map(str, args), "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    return np.array([it["result"]["vector"] for it in out["items"]], np.float32), out


def test_onnxruntime_gives_the_transformers_vectors_and_logs_what_ran(bert, session_cache):
    ref, out_tf = embed(*TEXTS, "--model", bert, "--runtime", "transformers", "--dtype", "float32")
    vec, out = embed(*TEXTS, "--model", bert, "--runtime", "onnxruntime")
    assert (out_tf["runtime"], out_tf["dtype"]) == ("transformers", "float32")
    assert (out["runtime"], out["dtype"], out["device"]) == ("onnxruntime", "float32", "cpu")
    assert (vec * ref).sum(1).min() > 0.9999
    assert [it["result"]["tokens"] for it in out["items"]] == [it["result"]["tokens"] for it in out_tf["items"]]

    logged = CliRunner().invoke(main, ["logs", "show", out["id"]])
    assert logged.exit_code == 0, logged.output
    row = json.loads(logged.stdout)
    assert (row["runtime"], row["dtype"]) == ("onnxruntime", "float32")
    assert "onnx-text" in logged.stdout  # the note names the export that ran, with its digest

    listed = CliRunner().invoke(main, ["cache", "list", "--json"])
    kinds = {e["name"].split("/")[0]: e["kind"] for e in json.loads(listed.stdout)["entries"]}
    assert kinds.get("onnx-text") == "onnx"


def test_onnxruntime_refuses_what_it_cannot_run(bert):
    r = CliRunner().invoke(main, ["embed", "x", "--model", bert, "--runtime", "onnxruntime", "--dtype", "bfloat16"])
    assert r.exit_code != 0 and "--runtime transformers" in r.output


@pytest.mark.parametrize(
    "bf16,args,expected",
    [
        (False, [], "onnxruntime"),  # a CPU without bf16 units: ONNX Runtime float32
        (True, [], "transformers"),  # bf16 units: transformers in bf16
        (False, ["--dtype", "bfloat16"], "transformers"),
        (False, ["--runtime", "transformers"], "transformers"),
    ],
)
def test_the_default_runtime_follows_the_cpu(bert, monkeypatch, bf16, args, expected):
    monkeypatch.setattr(encoder, "cpu_has_bf16", lambda: bf16)
    monkeypatch.setattr(encoder, "_maybe_accelerator", lambda: False)
    _, out = embed("the cat", "--model", bert, *args)
    assert out["runtime"] == expected


def test_search_and_zero_shot_classify_run_on_onnxruntime_too(bert, tmp_path, monkeypatch):
    """search and zero-shot classify share embed's encoder and its choice of runtime; classify's
    onnxruntime row takes a sentence encoder (zero-shot text) as well as an image EfficientNet,
    with the scores transformers gives."""
    monkeypatch.setattr(encoder, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(encoder, "_maybe_accelerator", lambda: False)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("the cat sat\n\nthe dog barked\n\nstock prices fell\n")
    outs = {}
    for args in (
        ["search", "cat", "--corpus", corpus, "-k", "2"],
        ["classify", "good movie", "the worst", "--labels", "good,bad"],
        ["classify", "good movie", "the worst", "--labels", "good,bad", "--runtime", "transformers"],
    ):
        r = CliRunner().invoke(main, [*map(str, args), "--model", bert, "--json", "-q"])
        assert r.exit_code == 0, r.output
        outs[" ".join(map(str, args[:1] + args[-1:]))] = json.loads(r.stdout.splitlines()[-1])
    assert [o["runtime"] for o in outs.values()] == ["onnxruntime", "onnxruntime", "transformers"]
    ort, tf = outs["classify good,bad"], outs["classify transformers"]
    for a, b in zip(ort["items"], tf["items"]):
        assert [lab["label"] for lab in a["result"]["labels"]] == [lab["label"] for lab in b["result"]["labels"]]
        assert [lab["score"] for lab in a["result"]["labels"]] == pytest.approx(
            [lab["score"] for lab in b["result"]["labels"]], abs=1e-4
        )


def test_auto_runtime_leaves_other_models_and_devices_alone(monkeypatch):
    from taskrun.tasks.base import ModelCard

    monkeypatch.setattr(encoder, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(encoder, "_maybe_accelerator", lambda: False)
    card = ModelCard(
        name="m",
        path="/x",
        architecture="BertModel",
        tasks=("embed",),
        runtime="transformers",
        runtimes=("transformers",),
        size_bytes=0,
        digest="sha256:0",
        source="test",
        kind="sentence-embedding",
        format="safetensors",
    )
    assert encoder.auto_runtime("embed", card, None, "auto", "auto").runtime == "onnxruntime"
    assert encoder.auto_runtime("embed", card, None, "cuda", "auto").runtime == "transformers"
    custom = replace(card, architecture="NomicBertModel")
    assert encoder.auto_runtime("embed", custom, None, "auto", "auto").runtime == "transformers"
    assert "onnxruntime" in encoder.auto_runtime("embed", custom, None, "auto", "auto").runtimes
    other = replace(card, kind="text-classification", architecture="BertForSequenceClassification")
    assert encoder.auto_runtime("classify", other, None, "auto", "auto") == other
    monkeypatch.delitem(pipelines.RUNTIMES, ("embed", "onnxruntime"))  # a table without the row
    assert encoder.auto_runtime("embed", card, None, "auto", "auto").runtime == "transformers"


def test_batches_hold_a_token_budget_and_every_text_once():
    tokens = [100, 3, 50, 7, 7, 20, 1000]
    order = sorted(range(len(tokens)), key=tokens.__getitem__, reverse=True)
    got = list(encoder.batches(order, tokens, batch_size=3, batch_tokens=120))
    assert sorted(i for b in got for i in b) == list(range(len(tokens)))
    assert got[0] == [6]  # longer than the budget alone: a batch of one
    assert all(len(b) <= 3 and (len(b) == 1 or len(b) * tokens[b[0]] <= 120) for b in got)
    assert list(encoder.batches(order, tokens, 3, None)) == [order[:3], order[3:6], order[6:]]


@pytest.mark.real
def test_minilm_on_onnxruntime_matches_sentence_transformers_float32():
    from sentence_transformers import SentenceTransformer

    from taskrun.models.resolve import resolve
    from taskrun.runner.bench.embed import sentences

    texts = sentences(200, seed=3) + ["The quick brown fox jumps over the lazy dog. " * 40]  # one cut at 256
    ours, out = embed(*texts, "--runtime", "onnxruntime")
    assert (out["runtime"], out["dtype"]) == ("onnxruntime", "float32") and out["items"][-1]["result"]["truncated"]
    ref = SentenceTransformer(resolve("minilm").path, device="cpu").encode(texts, normalize_embeddings=True)
    assert (ours * ref).sum(1).min() >= 0.999
    assert np.abs(ours - ref).max() < 1e-4


@pytest.mark.parametrize("which", ["tiny", pytest.param("minilm", marks=pytest.mark.real)])
def test_the_onnxruntime_engine_tokenizes_as_transformers_does_without_importing_it(bert, which, tmp_path):
    """The engine reads tokenizer.json on the `tokenizers` library itself: the same ids, window
    and padding id as PreTrainedTokenizerFast (which runs the same file), and a cold `run embed`
    on a cached export imports neither transformers nor torch (0.7 s and 1.9 s)."""
    from pathlib import Path

    from transformers import PreTrainedTokenizerFast

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.text.ort_encoder import _tokenizer
    from taskrun.runner.bench.embed import sentences

    path = Path(resolve(bert if which == "tiny" else "minilm").path)
    ours, theirs = _tokenizer(path), PreTrainedTokenizerFast.from_pretrained(str(path))
    texts = [*sentences(300, seed=5), "héllo wörld 42 😀 日本語", "", "  spaces  ", "the kitten " * 400]
    assert ours(texts)["input_ids"] == theirs(texts, add_special_tokens=True, truncation=False)["input_ids"]
    assert (ours.model_max_length, ours.pad_token_id) == (theirs.model_max_length, theirs.pad_token_id)
    if which != "tiny":
        return
    from tests.process_helpers import cli_imports

    embed("warm the export", "--model", bert, "--runtime", "onnxruntime")
    r, heavy = cli_imports("embed", "hello", "--model", bert, "--runtime", "onnxruntime", "-q")
    assert heavy == [], r.stderr


def test_a_damaged_export_is_rebuilt_with_one_warning(bert, session_cache):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines import clear_cache
    from taskrun.pipelines.text.onnx_export import GRAPH, exported_dir

    ref, _ = embed("the cat", "--model", bert, "--runtime", "onnxruntime")
    graph = exported_dir(resolve(bert)) / GRAPH
    data = bytearray(graph.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\0" * 64
    graph.write_bytes(bytes(data))
    clear_cache()  # a new process: the engine loads again and checks its export
    r = CliRunner().invoke(main, ["embed", "the cat", "--model", bert, "--runtime", "onnxruntime", "--json", "-q"])
    assert r.exit_code == 0, r.output
    assert "rebuilt" in r.stderr and r.stderr.count("warning:") == 1
    vec = np.array(json.loads(r.stdout)["items"][0]["result"]["vector"], np.float32)
    assert float(vec @ ref[0]) > 0.9999
