"""embed -o: the vectors in the formats other tools read (.npy, .jsonl, .parquet, .csv), each read
back by that format's own reader equal to the .npy array; any other suffix refused before a model
loads. Fast: the tiny random BERT stands in for real weights."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.tasks import vector_files
from tests.tiny.bert import build as tiny_bert

TEXTS = ["the cat", 'a dog, "quoted"', "stock prices\tfell", "naïve café ☕"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


@pytest.fixture
def vectors(bert, tmp_path):
    """The reference: the same texts through -o .npy."""
    out = tmp_path / "ref.npy"
    r = invoke("embed", *TEXTS, "--model", bert, "-o", out, "-q")
    assert r.exit_code == 0, r.output
    return np.load(out)


def read_back(path, fmt):
    """(texts, matrix) read with the reader a user of that format would use."""
    if fmt == "jsonl":
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        return [r["text"] for r in rows], np.array([r["vector"] for r in rows], np.float32)
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert rows[0][0] == "text" and rows[0][1:4] == ["v0", "v1", "v2"]
        return [r[0] for r in rows[1:]], np.array([[float(x) for x in r[1:]] for r in rows[1:]], np.float32)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        assert table.schema.field("vector").type == pa.list_(pa.float32(), 32)  # fixed_size_list
        assert table.schema.field("text").type == pa.string()
        return table.column("text").to_pylist(), np.array(table.column("vector").to_pylist(), np.float32)
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_each_format_reads_back_equal_to_npy(fmt, bert, vectors, tmp_path):
    out = tmp_path / f"v.{fmt}"
    r = invoke("embed", *TEXTS, "--model", bert, "-o", out, "-q")
    assert r.exit_code == 0, r.output
    texts, m = read_back(out, fmt)
    assert texts == TEXTS
    assert m.shape == vectors.shape == (4, 32)
    assert np.abs(m - vectors).max() <= 1e-6


def test_text_formats_go_to_stdout_too(bert, vectors):
    r = invoke("embed", *TEXTS, "--model", bert, "--format", "jsonl", "-q")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert np.abs(np.array([row["vector"] for row in rows]) - vectors).max() <= 1e-6


@pytest.mark.parametrize("name", ["vectors.txt", "vectors.tsv", "vectors.xlsx", "vectors"])
def test_other_suffixes_are_refused_before_any_model_loads(name, tmp_path):
    # A model path that does not exist: had it been resolved, the error would name it instead.
    r = invoke("embed", "the cat", "--model", tmp_path / "no-such-model", "-o", tmp_path / name)
    assert r.exit_code != 0
    assert ".npy, .jsonl, .parquet or .csv" in r.output and "no-such-model" not in r.output
    assert not (tmp_path / name).exists()


def test_format_and_suffix_must_agree(tmp_path):
    r = invoke("embed", "the cat", "--model", tmp_path / "nope", "--format", "csv", "-o", tmp_path / "v.parquet")
    assert r.exit_code != 0 and "disagree" in r.output


def test_binary_formats_need_a_file(bert):
    r = invoke("embed", "the cat", "--model", bert, "--format", "parquet")
    assert r.exit_code == 1 and "-o vectors.parquet" in r.output


def test_writers_round_trip_exactly_float32():
    rng = np.random.default_rng(0)
    m = (rng.standard_normal((3, 7)) * 50).astype(np.float32)  # unnormalised, large values too
    texts = ["a", "b,c", "d\ne"]
    rows = [json.loads(line) for line in vector_files.to_jsonl(texts, list(m)).splitlines()]
    assert np.array_equal(np.array([r["vector"] for r in rows], np.float32), m)
    body = list(csv.reader(vector_files.to_csv(texts, list(m)).splitlines(keepends=True)))
    assert [r[0] for r in body[1:]] == texts
    assert np.array_equal(np.array([[float(x) for x in r[1:]] for r in body[1:]], np.float32), m)
