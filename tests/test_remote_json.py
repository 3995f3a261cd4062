"""`--server`'s client side without a server: a job's JSON rebuilt into the task's own objects
prints and writes exactly what the local job did; server-side input names map back to local
ones; the NDJSON stream's errors become one-line errors."""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskrun.pipelines import RUNTIMES
from taskrun.runner.cli import main
from taskrun.runner.inputs import options_from
from taskrun.runner.remote.client import Sources, attach_images, local_options, wire_options
from taskrun.runner.remote.http import http_error, read_stream
from taskrun.runner.remote.records import build, from_json, record_of
from taskrun.tasks import REGISTRY
from taskrun.tasks.base import Input, TaskError, to_jsonable
from taskrun.tasks.transcribe import Segment, Transcript, Word, to_srt
from tests.tiny import models_toml_with


def run_json(args: list[str]) -> dict:
    result = CliRunner().invoke(main, [*args, "--json", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def cli_values(task, option_args: list[str]) -> dict:
    """The option values click parses from ``option_args`` for ``task``'s command."""
    from taskrun.runner.cli import task_command

    cmd = task_command(task)
    ctx = cmd.make_context(task.name, list(option_args), resilient_parsing=True)
    names = {f.name for f in dataclasses.fields(task.Options)}
    return {k: v for k, v in ctx.params.items() if k in names}


@pytest.mark.parametrize("row", sorted(RUNTIMES), ids="{0[0]}-{0[1]}".format)
def test_a_rebuilt_job_prints_the_same_json(row, tiny_dir, tmp_path, monkeypatch):
    name, runtime = row
    task = REGISTRY[name]
    case = importlib.import_module(f"tests.tiny.{name}").case(tiny_dir, runtime)
    if case.aliases:
        monkeypatch.setenv("TASKRUN_MODELS_TOML", str(models_toml_with(case.aliases, tmp_path)))
    job = run_json([name, *case.args, "--model", case.model, "--runtime", runtime, *case.options])
    options = options_from(task, cli_values(task, case.options))
    rec = record_of(task, job, options)
    assert all(isinstance(r, task.Result) for r in rec.results)
    assert json.loads(json.dumps(to_jsonable(rec.to_json()))) == job  # as print_json prints it


def test_embeddings_from_exact_json_write_the_same_npy_and_text(tiny_dir):
    from taskrun.runner.jobs import run_job
    from taskrun.tasks.inputs import text_input

    task = REGISTRY["embed"]
    case = importlib.import_module("tests.tiny.embed").case(tiny_dir)
    options = options_from(task, {})
    local = run_job(task, lambda: [text_input(t, "t") for t in case.args], options, model=case.model)
    job = json.loads(json.dumps(local.to_json()))  # vectors as float32 values, unrounded
    rec = record_of(task, job, options)
    for fmt in sorted(set(task.formats) - {"text", "json"}):  # npy, and whatever else embed writes
        assert task.write(rec.results, fmt, Path(f"x.{fmt}"), options) == task.write(
            local.results, fmt, Path(f"x.{fmt}"), options
        ), fmt
    assert [task.render(r, options) for r in rec.results] == [task.render(r, options) for r in local.results]
    assert to_jsonable(rec.to_json()) == to_jsonable(local.to_json())


def test_nested_frozen_dataclasses_and_tuples():
    data = {
        "source": "a.wav",
        "text": "hi there",
        "language": "en",
        "audio_s": 2.0,
        "segments": [
            {
                "start": 0.0,
                "end": 1.5,
                "text": "hi there",
                "words": [{"start": 0.0, "end": 0.5, "word": "hi", "probability": 0.9}],
            },
            {"start": 1.5, "end": 2.0, "text": "", "words": None},
        ],
    }
    tr = from_json(Transcript, data)
    assert tr.segments[0] == Segment(0.0, 1.5, "hi there", (Word(0.0, 0.5, "hi", 0.9),))
    assert tr.segments[1].words is None
    direct = Transcript(
        "a.wav",
        "hi there",
        "en",
        2.0,
        [Segment(0.0, 1.5, "hi there", (Word(0.0, 0.5, "hi", 0.9),)), Segment(1.5, 2.0, "", None)],
    )
    assert tr == direct and to_srt([tr]) == to_srt([direct])


def test_a_field_the_client_does_not_know_is_an_error_naming_the_fix():
    with pytest.raises(TaskError, match="same taskrun version"):
        build(Word, {"start": 0, "end": 1, "word": "x", "probability": 1, "emotion": "calm"})


def test_image_pixels_from_the_servers_png_write_the_same_file(tiny_dir, tmp_path):
    task = REGISTRY["image"]
    case = importlib.import_module("tests.tiny.image").case(tiny_dir)
    local = tmp_path / "local.png"
    job = run_json(["image", *case.args, "--model", case.model, *case.options, "-o", str(local)])
    options = options_from(task, cli_values(task, case.options))
    rec = record_of(task, job, options)
    attach_images(task, rec, [{"name": "x.png", "data": base64.b64encode(local.read_bytes()).decode()}])
    again = tmp_path / "again.png"
    task.write(rec.results, "png", again, options)
    assert again.read_bytes() == local.read_bytes()
    with pytest.raises(TaskError, match="2 file"):
        attach_images(task, rec, [{"name": "x", "data": ""}] * 2)


def test_server_side_input_names_map_to_local_ones(tmp_path):
    audio = tmp_path / "my talk.wav"
    audio.write_bytes(b"RIFF....WAVE")
    inputs = [
        Input(source="argument 1", kind="text", text="hello"),
        Input(source=str(audio), kind="audio", path=str(audio)),
    ]
    names = Sources(REGISTRY["transcribe"], inputs)
    tmp = "/tmp/taskrun-upload-ab_12cd/0001-my_talk.wav"
    job = {
        "items": [
            {"index": 0, "input": "input 1", "result": {"text": "input 1"}},
            {
                "index": 1,
                "input": "my talk.wav",
                "result": {"source": "my talk.wav", "note": tmp, "text": "said my talk.wav twice"},
            },
        ],
        "errors": [],
        "error": f"{tmp}: damaged.",
    }
    out = names.job(job)
    assert [it["input"] for it in out["items"]] == ["argument 1", str(audio)]
    assert out["items"][0]["result"] == {"text": "input 1"}  # a text result is never renamed
    assert out["items"][1]["result"] == {"source": str(audio), "note": str(audio), "text": "said my talk.wav twice"}
    assert out["error"] == f"{audio}: damaged."
    # a server that names uploads by the name sent: messages get the local path, whole names only
    assert (
        names.text("my talk.wav is damaged; not old-my talk.wav.bak") == f"{audio} is damaged; not old-my talk.wav.bak"
    )


def test_two_files_of_one_name_map_by_their_index(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [tmp_path / "a" / "x.wav", tmp_path / "b" / "x.wav"]
    names = Sources(REGISTRY["transcribe"], [Input(source=str(f), kind="audio", path=str(f)) for f in files])
    assert names.text("x.wav: bad", 1) == f"{files[1]}: bad"
    assert names.text("x.wav: bad") == "x.wav: bad"  # which one is unknown: left as the server said


def test_options_sent_are_the_non_default_ones_and_path_options_travel_as_documented(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string"}}}))
    gen = REGISTRY["generate"]
    opts = local_options(gen, {"max_tokens": 16, "stop": ("x",), "json_schema": str(schema)})
    assert wire_options(gen, opts) == {
        "max_tokens": 16,
        "stop": ["x"],
        "json_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
    }
    search = REGISTRY["search"]
    opts = local_options(search, {"corpus": "docs", "top_k": 2})  # a name on the server, not a local path
    assert opts.corpus == "docs" and wire_options(search, opts) == {"corpus": "docs", "top_k": 2}
    image = REGISTRY["image"]
    assert wire_options(image, local_options(image, {"out_dir": str(tmp_path), "seed": 3})) == {"seed": 3}


def test_stream_events_then_done():
    seen = []
    lines = [
        '{"event": "token", "index": 0, "text": "Hi"}',
        "",
        '{"event": "done", "job": {"id": "x"}, "files": []}',
        '{"event": "token", "text": "late"}',
    ]
    done = read_stream(iter(lines), lambda kind, data: seen.append((kind, data["text"])), str)
    assert seen == [("token", "Hi")] and done["job"] == {"id": "x"}


@pytest.mark.parametrize(
    "lines, match",
    [
        (['{"event": "error", "error": {"message": "argument 1 is empty; give some text"}}'], "^argument 1 is empty"),
        (['{"event": "token", "text": "a"}'], "without its result"),
        (["<html>"], "not JSON"),
    ],
)
def test_stream_failures_are_one_line_errors(lines, match):
    with pytest.raises(TaskError, match=match):
        read_stream(iter(lines), lambda kind, data: None, str)


def test_http_errors_keep_the_servers_message():
    body = json.dumps({"error": {"message": "no model named 'x'", "type": "invalid_request_error"}}).encode()
    assert http_error("h:1", 404, body) == "no model named 'x'"
    assert "--api-key" in http_error("h:1", 401, b'{"error": {"message": "missing key"}}')
    assert "is it a taskrun server" in http_error("h:1", 404, b"Not Found")


def test_connection_refused_names_the_url_and_how_to_start_a_server():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the client connects: nothing listens
    url = f"http://127.0.0.1:{port}"
    result = CliRunner().invoke(main, ["embed", "hello", "--server", url])
    assert result.exit_code == 1
    assert url in result.output and "run serve" in result.output and "TASKRUN_SERVER" in result.output
    env = CliRunner().invoke(main, ["embed", "hello"], env={"TASKRUN_SERVER": url})
    assert env.exit_code == 1 and url in env.output


def test_device_is_the_servers_choice():
    result = CliRunner().invoke(main, ["embed", "hello", "--server", "http://127.0.0.1:9", "--device", "cpu"])
    assert result.exit_code == 1 and "server's choice" in result.output


def test_local_options_errors_come_before_anything_is_sent():
    result = CliRunner().invoke(main, ["embed", "hello", "--server", "http://127.0.0.1:9", "--batch-size", "0"])
    assert result.exit_code == 1
    assert "--batch-size must be at least 1" in result.output and "cannot reach" not in result.output


def test_files_are_sent_as_bytes_never_paths(tmp_path):
    from taskrun.runner.remote.client import wire_inputs

    f = tmp_path / "a.wav"
    f.write_bytes(b"RIFF0000WAVEdata")
    sent = wire_inputs(
        REGISTRY["classify"],
        [Input(source=str(f), kind="audio", path=str(f)), Input(source="argument 1", kind="text", text="hi")],
    )
    assert sent == [{"data": base64.b64encode(f.read_bytes()).decode(), "name": "a.wav"}, {"text": "hi"}]
    notes = tmp_path / "notes.txt"
    notes.write_text("not audio")
    as_text = Input(source=str(notes), kind="text", text="not audio", path=str(notes))
    assert wire_inputs(REGISTRY["transcribe"], [as_text])[0]["name"] == "notes.txt"  # refused there
    assert wire_inputs(REGISTRY["generate"], [as_text]) == [{"text": "not audio"}]
    assert str(tmp_path) not in json.dumps(sent)


def test_importing_the_cli_with_server_support_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, taskrun.runner.cli, taskrun.runner.remote.client, taskrun.runner.remote.http; "
        "print([m for m in ('torch', 'httpx', 'fastapi', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_then_chain_runs_here_and_says_so(tiny_dir):
    model = importlib.import_module("tests.tiny.generate").case(tiny_dir).model
    result = CliRunner().invoke(
        main,
        [
            "generate",
            "Hello",
            "--model",
            model,
            "--max-tokens",
            "4",
            "--then",
            f"summarize={model}",
            "--server",
            "http://127.0.0.1:9",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "--then chains run here" in result.stderr and "── summarize ──" in result.stderr
