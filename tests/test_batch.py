"""`run batch` on the local engine: the three input formats, good and bad items side by side,
side files, the run log, duplicate ids, and bounded memory. Tiny random models (tests/tiny)."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.runlog.store import RunLog
from tests.tiny.bert import build as build_bert
from tests.tiny.whisper import build_ct2, clip

RUN = str(Path(sys.executable).parent / "run")


def batch(*args):
    return CliRunner().invoke(main, ["batch", *map(str, args)])


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    text = Path(path).read_text()
    assert text.endswith("\n"), "the output ends inside a line"
    return [json.loads(line) for line in text.splitlines()]


def cli_json(*args) -> dict:
    r = CliRunner().invoke(main, [*map(str, args), "--json", "-q"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def bert(tiny_dir) -> str:
    return str(build_bert(tiny_dir))


@pytest.fixture
def whisper(tiny_dir) -> str:
    return str(build_ct2(tiny_dir))


def test_taskrun_jobs_good_and_bad_items(bert, tmp_path):
    jobs = write_jsonl(
        tmp_path / "jobs.jsonl",
        [
            {"id": "a", "task": "embed", "input": "the cat", "model": bert},
            {"id": 7, "task": "embed", "input": "a dog", "model": bert},
            {"task": "embed", "input": ["the kitten", "stock prices"], "model": bert},  # no id: line-3
            {"id": "opt", "task": "embed", "input": "x", "model": bert, "options": {"nope": 1}},
            {"id": "gone", "task": "transcribe", "input": "recordings/missing.wav"},
            {"id": "typo", "task": "embedd", "input": "x"},
            {
                "id": "cls",
                "task": "classify",
                "input": "good movie",
                "model": bert,
                "options": {"labels": ["good", "bad"]},
            },
        ],
    )
    r = batch(jobs, "-o", tmp_path / "out.jsonl")
    assert r.exit_code == 1 and "3 item(s) failed" in r.output
    lines = {x["id"]: x for x in read_jsonl(tmp_path / "out.jsonl")}
    assert set(lines) == {"a", "7", "line-3", "opt", "gone", "typo", "cls"}
    assert {k for k, x in lines.items() if x["status"] == "ok"} == {"a", "7", "line-3", "cls"}
    assert "unknown option nope" in lines["opt"]["error"]
    assert lines["gone"]["error"] == "recordings/missing.wav: no such file"
    assert "no task named 'embedd'" in lines["typo"]["error"]
    # The result is exactly the item's result as `run TASK --json` gives it.
    assert lines["a"]["result"] == cli_json("embed", "the cat", "-m", bert)["items"][0]["result"]
    cls = cli_json("classify", "good movie", "-m", bert, "--labels", "good,bad")
    assert lines["cls"]["result"] == cls["items"][0]["result"]
    assert [x["text"] for x in lines["line-3"]["result"]] == ["the kitten", "stock prices"]
    # a, 7 and line-3 share a model and options: one job, its metrics and run id on each line
    ok = [lines[k] for k in ("a", "7", "line-3")]
    assert len({x["run_id"] for x in ok}) == 1 and ok[0]["metrics"]["job_items"] == 4
    assert ok[0]["model"]["digest"].startswith("sha256:")
    rows = RunLog().recent(50)
    summary = next(row for row in rows if row["task"] == "batch")
    assert summary["status"] == "partial" and summary["metrics"]["ok"] == 4 and summary["metrics"]["failed"] == 3
    jobs_of_batch = {row["id"] for row in RunLog().recent(50, chain_id=summary["id"])}
    assert ok[0]["run_id"] in jobs_of_batch and lines["opt"]["run_id"] in jobs_of_batch


def test_openai_batch_requests(bert, tmp_path):
    from openai.types import CreateEmbeddingResponse

    reqs = write_jsonl(
        tmp_path / "requests.jsonl",
        [
            {
                "custom_id": "one",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": bert, "input": "the cat"},
            },
            {
                "custom_id": "two",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": bert, "input": ["a dog", "the kitten"], "encoding_format": "base64"},
            },
            {
                "custom_id": "dims",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": bert, "input": "x", "dimensions": 8},
            },
            {"custom_id": "where", "method": "POST", "url": "/v1/nowhere", "body": {}},
        ],
    )
    r = batch(reqs, "-o", tmp_path / "out.jsonl")
    assert r.exit_code == 1
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out.jsonl")}
    assert all(x["id"].startswith("batch_req_") for x in lines.values())
    one = CreateEmbeddingResponse.model_validate(lines["one"]["response"]["body"])
    assert lines["one"]["error"] is None and lines["one"]["response"]["status_code"] == 200
    two = lines["two"]["response"]["body"]["data"]
    assert len(one.data) == 1 and [d["index"] for d in two] == [0, 1]
    # the vectors are those `run embed` gives (base64: little-endian float32, as OpenAI sends them)
    vec = cli_json("embed", "the cat", "-m", bert)["items"][0]["result"]["vector"]
    assert one.data[0].embedding == pytest.approx(vec, abs=1e-6)
    dog = np.frombuffer(base64.b64decode(two[0]["embedding"]), dtype="<f4")
    assert dog.tolist() == pytest.approx(
        cli_json("embed", "a dog", "-m", bert)["items"][0]["result"]["vector"], abs=1e-6
    )
    assert lines["dims"]["response"]["status_code"] == 400
    assert lines["dims"]["response"]["body"]["error"]["param"] == "dimensions"
    assert lines["where"]["response"]["status_code"] == 404
    assert "no OpenAI endpoint" in lines["where"]["error"]["message"]


def test_a_folder_of_recordings(whisper, tiny_dir, tmp_path):
    rec = tmp_path / "recordings"
    (rec / "sub").mkdir(parents=True)
    shutil.copy(clip(tiny_dir), rec / "a.wav")
    shutil.copy(clip(tiny_dir), rec / "sub" / "b.wav")
    (rec / "notes.txt").write_text("not audio: not an input")
    (rec / "broken.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 20)  # a header, no audio
    srt = tmp_path / "srt"
    srt.mkdir()
    r = batch(
        "transcribe",
        rec,
        "-o",
        tmp_path / "out.jsonl",
        "-m",
        whisper,
        "--out-dir",
        srt,
        "--workers",
        "1",
        "-O",
        "language=en",
    )
    assert r.exit_code == 1, r.output
    lines = {x["id"]: x for x in read_jsonl(tmp_path / "out.jsonl")}
    assert set(lines) == {"a.wav", "sub/b.wav", "broken.wav"}
    assert lines["broken.wav"]["status"] == "failed" and "broken.wav" in lines["broken.wav"]["error"]
    # The random tiny Whisper falls back to sampling (faster-whisper's temperature fallback), so
    # its words differ run to run; tests/test_batch_ray.py compares real transcripts word for word.
    want = cli_json("transcribe", rec / "a.wav", "-m", whisper, "--language", "en")["items"][0]["result"]
    got = lines["a.wav"]["result"]
    assert (
        set(got) == set(want)
        and {k: got[k] for k in ("source", "language", "audio_s")}
        == {k: want[k] for k in ("source", "language", "audio_s")}
        and got["segments"]
    )
    assert lines["a.wav"]["metrics"]["rtf"] > 0 and lines["a.wav"]["metrics"]["job_items"] == 1
    assert lines["sub/b.wav"]["files"] == [str(srt / "sub" / "b.wav.srt")]
    assert (srt / "sub" / "b.wav.srt").read_text().startswith("1\n00:00:")


def test_a_text_file_is_one_item_per_line(bert, tmp_path):
    (tmp_path / "s.txt").write_text("the cat\n\na dog\n")
    r = batch("embed", tmp_path / "s.txt", "-o", tmp_path / "out.jsonl", "-m", bert, "-O", "batch_size=1")
    assert r.exit_code == 0, r.output
    lines = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(x["id"] for x in lines) == [f"{tmp_path / 's.txt'}:1", f"{tmp_path / 's.txt'}:3"]


def test_duplicate_ids_are_refused_before_anything_loads(tmp_path):
    jobs = write_jsonl(
        tmp_path / "jobs.jsonl",
        [
            {"id": "x", "task": "embed", "input": "a"},
            {"id": "y", "task": "embed", "input": "b"},
            {"id": "x", "task": "embed", "input": "c"},
        ],
    )
    r = batch(jobs, "-o", tmp_path / "out.jsonl")
    assert r.exit_code != 0 and "id 'x' is on line 1 and line 3" in r.output
    assert not (tmp_path / "out.jsonl").exists() and RunLog().count() == 0


def test_a_file_holds_one_format(tmp_path):
    jobs = write_jsonl(
        tmp_path / "jobs.jsonl",
        [
            {"id": "x", "task": "embed", "input": "a"},
            {"custom_id": "y", "method": "POST", "url": "/v1/embeddings", "body": {"input": "b"}},
        ],
    )
    r = batch(jobs, "-o", tmp_path / "out.jsonl")
    assert r.exit_code != 0 and "line 2 is an OpenAI Batch request but line 1 is a taskrun job" in r.output
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "task": "embed", "input": "a"}\n{"id": \n')
    r = batch(tmp_path / "bad.jsonl", "-o", tmp_path / "out.jsonl")
    assert r.exit_code != 0 and "line 2 is not JSON" in r.output


def test_rerun_skips_done_ids_and_retry_failed_runs_the_failed_again(bert, tmp_path):
    (tmp_path / "late.txt").write_text("the cat")  # a text file: embed reads it once it exists
    jobs = write_jsonl(
        tmp_path / "jobs.jsonl",
        [
            {"id": "a", "task": "embed", "input": "the cat", "model": bert},
            {"id": "b", "task": "embed", "input": {"path": str(tmp_path / "later.txt")}, "model": bert},
        ],
    )
    out = tmp_path / "out.jsonl"
    assert batch(jobs, "-o", out).exit_code == 1
    first = read_jsonl(out)
    r = batch(jobs, "-o", out)
    assert r.exit_code == 1 and "0 ok, 0 failed, 2 skipped" in r.output and read_jsonl(out) == first
    shutil.copy(tmp_path / "late.txt", tmp_path / "later.txt")
    r = batch(jobs, "-o", out, "--retry-failed")
    assert r.exit_code == 0 and "1 ok, 0 failed, 1 skipped" in r.output
    lines = read_jsonl(out)
    assert sorted(x["id"] for x in lines) == ["a", "b"] and all(x["status"] == "ok" for x in lines)
    assert [x for x in lines if x["id"] == "a"] == [x for x in first if x["id"] == "a"]  # kept as it was
    r = batch(jobs, "-o", out, "--restart")
    assert r.exit_code == 0 and "2 ok" in r.output and len(read_jsonl(out)) == 2


def test_openai_chat_lines_and_a_prompt_over_the_window(tiny_dir, tmp_path):
    from openai.types.chat import ChatCompletion

    from tests.tiny.generate import CONTEXT, build

    llama = str(build(tiny_dir))
    long = " ".join(["The meeting decided to ship the release on Friday."] * CONTEXT)
    reqs = write_jsonl(
        tmp_path / "requests.jsonl",
        [
            {
                "custom_id": "chat",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": llama,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "What is the capital?"}],
                },
            },
            {
                "custom_id": "long",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": llama, "max_tokens": 4, "prompt": long},
            },
            {
                "custom_id": "streamed",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": llama, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            },
        ],
    )
    r = batch(reqs, "-o", tmp_path / "out.jsonl")
    assert r.exit_code == 1, r.output
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out.jsonl")}
    chat = ChatCompletion.model_validate(lines["chat"]["response"]["body"])
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 4
    assert lines["chat"]["response"]["request_id"] == chat.id.removeprefix("chatcmpl-")  # the run id
    assert lines["long"]["response"]["status_code"] == 400 and "tokens" in lines["long"]["error"]["message"]
    assert lines["streamed"]["response"]["body"]["error"]["param"] == "stream"


def test_image_jobs_write_their_pngs_named_by_id(tiny_dir, tmp_path):
    from tests.tiny.sd import build

    sd = str(build(tiny_dir))
    jobs = write_jsonl(
        tmp_path / "jobs.jsonl",
        [
            {
                "id": "fox",
                "task": "image",
                "input": "a red fox",
                "model": sd,
                "options": {"steps": 2, "seed": 0, "n": 2},
            },
            {"id": "big", "task": "image", "input": "a cat", "model": sd, "options": {"size": "100000x100000"}},
        ],
    )
    pngs = tmp_path / "png"
    pngs.mkdir()
    r = batch(jobs, "-o", tmp_path / "out.jsonl", "--out-dir", pngs)
    assert r.exit_code == 1, r.output
    lines = {x["id"]: x for x in read_jsonl(tmp_path / "out.jsonl")}
    files = [str(pngs / "fox-1.png"), str(pngs / "fox-2.png")]
    assert lines["fox"]["files"] == files and [im["files"] for im in lines["fox"]["result"]["images"]] == [
        [f] for f in files
    ]
    assert all(Path(f).read_bytes().startswith(b"\x89PNG") for f in files)
    assert lines["big"]["status"] == "failed" and "size 100000x100000" in lines["big"]["error"]  # its JSONL field


def test_openai_audio_lines_read_files_by_path(whisper, tiny_dir, tmp_path):
    audio = str(clip(tiny_dir))
    reqs = write_jsonl(
        tmp_path / "requests.jsonl",
        [
            {
                "custom_id": "srt",
                "method": "POST",
                "url": "/v1/audio/transcriptions",
                "body": {"model": whisper, "file": audio, "language": "en", "response_format": "srt"},
            },
            {
                "custom_id": "json",
                "method": "POST",
                "url": "/v1/audio/transcriptions",
                "body": {"model": whisper, "file": audio, "language": "en"},
            },
            {
                "custom_id": "gone",
                "method": "POST",
                "url": "/v1/audio/transcriptions",
                "body": {"model": whisper, "file": str(tmp_path / "gone.wav")},
            },
        ],
    )
    r = batch(reqs, "-o", tmp_path / "out.jsonl")
    assert r.exit_code == 1, r.output
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out.jsonl")}
    assert lines["srt"]["response"]["body"].startswith("1\n00:00:")
    assert set(lines["json"]["response"]["body"]) == {"text"}
    assert lines["gone"]["response"]["status_code"] == 400 and "no such file" in lines["gone"]["error"]["message"]
