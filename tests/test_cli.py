"""The CLI as a user meets it: fast start, clear one-line errors, nothing half-written, every
job in the run log. Fast: the tiny random BERT stands in for real weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.tiny.bert import build as tiny_bert

ROOT = Path(__file__).resolve().parent.parent


def invoke(*args, input=None, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, env=env)


@pytest.fixture
def bert(tiny_dir):
    return str(tiny_bert(tiny_dir))


def last_run():
    return RunLog().recent(1)[0]


# --------------------------------------------------------------------------- fast start


def test_help_and_tasks_do_not_import_torch():
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom runner.cli import main\n"
        "for args in (['--help'], ['tasks'], ['tasks', '--json'], ['embed', '--help']):\n"
        "    r = CliRunner().invoke(main, args)\n"
        "    assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules, 'the CLI imported torch'\n"
        "assert 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_tasks_lists_every_task_with_what_it_takes_returns_and_measures():
    r = invoke("tasks", "--json")
    assert r.exit_code == 0
    rows = {d["task"]: d for d in json.loads(r.stdout)}
    assert {"embed", "search", "classify"} <= set(rows)
    emb = rows["embed"]
    assert [m["name"] for m in emb["measures"]] == ["items", "input_tokens", "items_per_s", "dim"]
    assert emb["default_models"]["embed"] == "minilm"
    assert "classify:text" in rows["classify"]["default_models"]


# --------------------------------------------------------------------------- inputs


def test_texts_from_args_file_and_stdin(bert, tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("the cat\n\nthe dog\n")
    for args, kw in ((["the cat", "the dog"], {}), (["-f", f], {}), ([], {"input": "the cat\nthe dog\n"})):
        r = invoke("embed", *args, "--model", bert, "--json", "-q", **kw)
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert [it["result"]["text"] for it in out["items"]] == ["the cat", "the dog"]
        assert len(out["items"][0]["result"]["vector"]) == 32


def test_npy_output(bert, tmp_path):
    out = tmp_path / "v.npy"
    r = invoke("embed", "the cat", "a dog", "--model", bert, "-o", out, "-q")
    assert r.exit_code == 0, r.output
    arr = np.load(out)
    assert arr.shape == (2, 32) and arr.dtype == np.float32
    assert np.allclose(np.linalg.norm(arr, axis=1), 1, atol=1e-5)


def test_npy_needs_a_file(bert):
    r = invoke("embed", "the cat", "--model", bert, "--format", "npy")
    assert r.exit_code == 1 and "-o vectors.npy" in r.output


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "name,make,expect",
    [
        ("empty text", lambda d: [""], "is empty"),
        ("blank text", lambda d: ["   "], "is empty"),
        ("missing file", lambda d: ["-f", str(d / "nope.txt")], "does not exist"),
        ("binary file", lambda d: [_write(d / "x.bin", bytes(range(256)) * 4)], "not text"),
        ("non-UTF-8", lambda d: [_write(d / "l1.txt", "café crème\n".encode("latin-1"))], "not UTF-8"),
        ("empty file", lambda d: [_write(d / "e.txt", b"")], "empty"),
        ("audio given to embed", lambda d: [_write(d / "a.wav", _wav_bytes())], "is an audio file"),
        ("image given to embed", lambda d: [_write(d / "a.png", _png_bytes())], "use `run classify`"),
    ],
)
def test_bad_input_is_one_clear_line_and_a_failed_log_row(bert, tmp_path, name, make, expect):
    args = make(tmp_path)
    r = invoke("embed", *args, "--model", bert, "-o", tmp_path / "out.npy")
    assert r.exit_code != 0, name
    assert expect in r.output, r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "out.npy").exists()
    if name != "missing file":  # click refuses a missing -f path before any job exists
        row = last_run()
        assert row["status"] == "failed" and row["task"] == "embed" and row["error"]


def test_unknown_option_is_refused_and_logged(bert):
    r = invoke("embed", "the cat", "--model", bert, "--temprature", "0.5")
    assert r.exit_code == 2 and "No such option" in r.output
    assert last_run()["status"] == "failed"


def test_invalid_option_value_names_the_fix(bert):
    r = invoke("embed", "the cat", "--model", bert, "--batch-size", "0")
    assert r.exit_code == 1 and "--batch-size must be at least 1" in r.output


def test_model_that_cannot_serve_the_task_is_refused_before_loading(tmp_path):
    llm = tmp_path / "llm"
    llm.mkdir()
    (llm / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    r = invoke("embed", "hello", "--model", llm)
    assert r.exit_code == 1
    assert "embed needs a sentence-embedding model such as minilm" in r.output
    assert last_run()["error"]


def test_corrupt_model_folder(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    r = invoke("embed", "hello", "--model", bad)
    assert r.exit_code == 1 and "corrupt" in r.output and "Traceback" not in r.output

    half = tmp_path / "half"  # a valid config but no weights or tokenizer
    half.mkdir()
    (half / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    r = invoke("embed", "hello", "--model", half)
    assert r.exit_code == 1 and "re-install or re-download" in r.output


def test_debug_variable_shows_the_traceback(tmp_path):
    r = invoke("embed", "hello", "--model", tmp_path / "missing-model", env={"TASKRUN_DEBUG": "1"})
    assert r.exit_code != 0 and r.exception is not None and type(r.exception).__name__ == "TaskError"


def test_hub_id_offline_fails_fast_with_advice():
    r = invoke("embed", "hello", "--model", "someorg/some-model", "--offline")
    assert r.exit_code == 1
    assert "offline" in r.output and "local folder" in r.output


# --------------------------------------------------------------------------- run log


def test_every_job_is_logged_with_model_digest_runtime_device_dtype(bert):
    r = invoke(
        "embed", "the cat", "--model", bert, "--runtime", "transformers", "--dtype", "float32", "--device", "cpu", "-q"
    )
    assert r.exit_code == 0, r.output
    row = last_run()
    assert row["status"] == "ok" and row["model_digest"].startswith("sha256:")
    assert (row["runtime"], row["device"], row["dtype"]) == ("transformers", "cpu", "float32")
    assert row["options"] == {"batch_size": 64, "normalize": True}
    assert row["input_digest"].startswith("sha256:") and row["inputs"] == 1
    assert {"load_s", "wall_s", "peak_rss_mb", "items", "dim"} <= set(row["metrics"])
    assert "torch" in row["versions"] and "transformers" in row["versions"]

    listing = invoke("logs", "--json", "-n", "5", "--task", "embed")
    assert json.loads(listing.stdout)[0]["id"] == row["id"]
    shown = invoke("logs", "show", row["id"][:18])
    assert json.loads(shown.stdout)["id"] == row["id"]
    assert invoke("logs", "show", "nope").exit_code == 1


def test_metrics_table_on_stderr_results_on_stdout(bert):
    r = invoke("embed", "the cat", "--model", bert)
    assert r.exit_code == 0
    assert "wall_s" in r.stderr and "wall_s" not in r.stdout
    assert "(32-d)" in r.stdout


# --------------------------------------------------------------------------- one failure policy
# Whether an input fails its check or fails inside the pipeline, and whatever the task: a lone
# failed input is a failed job with that input's message; a batch runs to the end, partial when
# some inputs succeeded and failed when none did.


@pytest.fixture
def vit(tiny_dir):
    from tests.tiny.vision import build_vit

    return str(build_vit(tiny_dir))


@pytest.fixture
def whisper(tiny_dir):
    from tests.tiny.whisper import build

    return str(build(tiny_dir))


def _broken_jpg(path: Path) -> str:
    return _write(path, b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(300))  # a JPEG header, no image


def _broken_wav(path: Path) -> str:
    return _write(path, b"RIFF" + b"\x00" * 4 + b"WAVE" + b"\xff" * 2000)  # no data chunk


BROKEN = {"classify": ("vit", _broken_jpg, ".jpg"), "transcribe": ("whisper", _broken_wav, ".wav")}


@pytest.mark.parametrize("task", sorted(BROKEN))
def test_a_lone_failed_input_is_a_failed_job_with_its_message(task, request, tmp_path):
    fixture, broken, ext = BROKEN[task]
    r = invoke(task, broken(tmp_path / f"broken{ext}"), "--model", request.getfixturevalue(fixture))
    assert r.exit_code == 1 and "Traceback" not in r.output
    row = last_run()
    assert row["task"] == task and row["status"] == "failed" and row["error"]
    assert f"Error: {row['error']}" in r.output and "inputs failed" not in r.output
    assert r.output.count(row["error"]) == 1  # said once, not as an item error and again as the job's


@pytest.mark.parametrize("task", sorted(BROKEN))
def test_a_batch_where_every_input_fails_is_a_failed_job(task, request, tmp_path):
    fixture, broken, ext = BROKEN[task]
    files = [broken(tmp_path / f"broken{n}{ext}") for n in (1, 2)]
    r = invoke(task, *files, "--model", request.getfixturevalue(fixture))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert all(f in r.output for f in files)  # each failed input is named
    row = last_run()
    assert row["task"] == task and row["status"] == "failed" and row["error"] and row["inputs"] == 2


def test_a_batch_where_some_inputs_fail_is_partial_and_the_others_finish(vit, tmp_path):
    from tests.tiny.vision import picture

    good = str(picture(tmp_path))
    r = invoke("classify", good, _broken_jpg(tmp_path / "broken.jpg"), "--model", vit, "--json", "-q")
    assert r.exit_code == 1 and "1 of 2 inputs failed (see the errors above); the others finished" in r.output
    out = json.loads(r.stdout)
    assert out["status"] == "partial" and [it["input"] for it in out["items"]] == [good]
    row = last_run()
    assert row["status"] == "partial" and row["error"] is None and row["inputs"] == 2


# --------------------------------------------------------------------------- helpers


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _wav_bytes() -> bytes:
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(1600, dtype=np.float32), 16000, format="WAV")
    return buf.getvalue()


def _png_bytes() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, format="PNG")
    return buf.getvalue()
