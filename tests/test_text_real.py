"""embed, search and text classify on the real packaged all-MiniLM-L6-v2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main

pytestmark = pytest.mark.real
SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def invoke(*args, input=None):
    r = CliRunner().invoke(main, [str(a) for a in args], input=input)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout) if "--json" in args else r


def vectors(texts, *opts):
    out = invoke("embed", *texts, "--json", "-q", *opts)
    return np.array([it["result"]["vector"] for it in out["items"]], dtype=np.float32), out


def test_embeddings_match_sentence_transformers_in_float32():
    from sentence_transformers import SentenceTransformer

    from taskrun.models.resolve import resolve

    texts = [
        "a cat",
        "A kitten is playing with yarn on the carpet.",
        "stock prices",
        "The quick brown fox jumps over the lazy dog. " * 40,
    ]  # longer than the 256-token window
    ours, out = vectors(texts, "--dtype", "float32")
    assert out["dtype"] == "float32" and out["metrics"]["dim"] == 384
    ref = SentenceTransformer(resolve("minilm").path, device="cpu").encode(texts, normalize_embeddings=True)
    assert np.abs(ours - ref).max() < 1e-4
    assert out["items"][3]["result"]["truncated"] is True


def test_cat_is_closer_to_kitten_than_to_stock_prices():
    v, out = vectors(["cat", "kitten", "stock prices"])
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3
    m = out["metrics"]
    assert m["items"] == 3 and m["input_tokens"] >= 3 and m["items_per_s"] > 0


def test_default_bf16_stays_close_to_float32():
    texts = [line for line in (SAMPLES / "texts.txt").read_text().splitlines() if line]
    fp32, _ = vectors(texts, "--dtype", "float32")
    auto, out = vectors(texts)
    cos = (fp32 * auto).sum(1)
    assert cos.min() > 0.999, (out["dtype"], cos)


ZERO_SHOT = [
    ("I loved this movie, the acting was wonderful.", "positive,negative", "positive"),
    ("What a waste of two hours, the plot made no sense.", "positive,negative", "negative"),
    ("Best pizza I have had in years, we will be back.", "positive,negative", "positive"),
    ("The soup was cold and the waiter ignored us.", "positive,negative", "negative"),
    ("The striker scored twice in the final minutes of the match.", "sports,politics,cooking,technology", "sports"),
    ("Parliament voted on the new budget bill today.", "sports,politics,cooking,technology", "politics"),
    ("Whisk the eggs with sugar, then fold in the flour.", "sports,politics,cooking,technology", "cooking"),
    ("The new phone has a faster chip and a better camera.", "sports,politics,cooking,technology", "technology"),
    ("My flight was delayed and the airline lost my bag.", "travel,finance,health", "travel"),
    ("The doctor said my blood pressure is too high.", "travel,finance,health", "health"),
    ("Interest rates rose and my mortgage payment went up.", "travel,finance,health", "finance"),
    ("It is raining heavily and the wind is very strong.", "weather,music,animals", "weather"),
    ("The orchestra played a symphony by Beethoven.", "weather,music,animals", "music"),
]


@pytest.mark.parametrize("text,labels,expected", ZERO_SHOT)
def test_zero_shot_picks_the_right_label(text, labels, expected):
    out = invoke("classify", text, "--labels", labels, "--json", "-q")
    res = out["items"][0]["result"]
    assert res["labels"][0]["label"] == expected, res["labels"]
    assert res["zero_shot"] is True
    assert abs(sum(lab["score"] for lab in res["labels"]) - 1) < 1e-3


def test_search_finds_the_passage_and_caches_the_corpus():
    q = "how long should a kitten stay with its mother?"
    first = invoke("search", q, "--corpus", SAMPLES / "docs", "-k", "2", "--json", "-q")
    hit = first["items"][0]["result"]["hits"][0]
    assert hit["file"] == "cats.md" and "eight weeks" in hit["text"]
    assert first["metrics"]["embedded_passages"] == first["metrics"]["passages"] > 5
    second = invoke("search", "tallest volcano", "--corpus", SAMPLES / "docs", "-k", "1", "--json", "-q")
    assert second["metrics"]["corpus_cached"] is True and second["metrics"]["embedded_passages"] == 0
    assert "Olympus Mons" in second["items"][0]["result"]["hits"][0]["text"]
