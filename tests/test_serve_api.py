"""The server's request parsers, wire format and settings, without a server: what each OpenAI and
Ollama field becomes (or why it is refused), and the native stream's lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskrun.runner.serve.batching import record_slice
from taskrun.runner.serve.settings import check_exposure, is_loopback, parse_corpora, parse_size
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.generate import Options
from taskrun.tasks.wire import native as wire
from taskrun.tasks.wire import ollama_api
from taskrun.tasks.wire.errors import APIError, from_task_error
from taskrun.tasks.wire.jobspec import Uploads
from taskrun.tasks.wire.openai_api import job_from_openai

CHAT = "/v1/chat/completions"
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(64)


@pytest.fixture
def uploads():
    with Uploads() as u:
        yield u


def refused(path: str, body: dict, uploads=None) -> APIError:
    with pytest.raises(APIError) as err:
        job_from_openai(path, body, uploads=uploads)
    return err.value


def test_chat_messages_become_system_history_and_prompt(uploads):
    spec = job_from_openai(
        CHAT,
        {
            "model": "m",
            "max_completion_tokens": 9,
            "stop": "END",
            "seed": 4,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": [{"type": "text", "text": "Why?"}]},
            ],
        },
        uploads=uploads,
    )
    assert spec.task == "generate" and spec.model == "m" and spec.inputs[0].text == "Why?"
    assert spec.options == {
        "system": "Be brief.",
        "history": [["user", "Hi"], ["assistant", "Hello."]],
        "max_tokens": 9,
        "stop": ["END"],
        "seed": 4,
        "stream": False,
    }
    options = Options(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.options.items()})
    assert options.history == (("user", "Hi"), ("assistant", "Hello."))


def test_a_json_schema_is_written_to_the_requests_own_folder(uploads):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    spec = job_from_openai(
        CHAT,
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        },
        uploads=uploads,
    )
    path = Path(spec.options["json_schema"])
    assert path.parent == uploads.dir and json.loads(path.read_text()) == schema


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 3}, "n"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"temperature": "hot"}, "temperature"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"whatever": 1}, "whatever"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
    ],
)
def test_chat_fields_taskrun_does_not_honour_are_named(extra, param):
    err = refused(CHAT, {"messages": [{"role": "user", "content": "x"}], **extra})
    assert err.status == 400 and err.param == param and err.body()["error"]["param"] == param


@pytest.mark.parametrize(
    "messages, param",
    [
        ([{"role": "tool", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "messages"),
        ([{"role": "user", "content": "x", "tool_calls": [{}]}], "messages[0].tool_calls"),
    ],
)
def test_messages_that_cannot_be_read_are_refused(messages, param):
    assert refused(CHAT, {"messages": messages}).param == param


def test_completions_are_raw_and_take_several_prompts():
    spec = job_from_openai("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3}, uploads=None)
    assert [i.text for i in spec.inputs] == ["a", "b"] and spec.options["raw"] is True


def test_embeddings_take_a_text_or_a_list_and_refuse_token_arrays():
    spec = job_from_openai("/v1/embeddings", {"input": ["a", "b"], "encoding_format": "base64"}, uploads=None)
    assert (spec.task, [i.text for i in spec.inputs]) == ("embed", ["a", "b"])
    assert refused("/v1/embeddings", {"input": [[1, 2, 3]]}).param == "input"
    assert refused("/v1/embeddings", {"input": "a", "dimensions": 64}).param == "dimensions"


def test_audio_is_an_upload_sniffed_by_content_and_a_path_only_for_batch(uploads, tmp_path):
    body = {"file": ("talk.wav", WAV), "response_format": "verbose_json", "timestamp_granularities[]": ["word"]}
    spec = job_from_openai("/v1/audio/transcriptions", body, uploads=uploads)
    (inp,) = spec.inputs
    assert inp.kind == "audio" and inp.source == "talk.wav" and Path(inp.path).parent == uploads.dir
    assert spec.options == {"task": "transcribe", "word_timestamps": True}
    assert job_from_openai("/v1/audio/translations", {"file": ("t.wav", WAV)}, uploads=uploads).options == {
        "task": "translate"
    }
    (tmp_path / "a.wav").write_bytes(WAV)
    assert refused("/v1/audio/transcriptions", {"file": str(tmp_path / "a.wav")}, uploads).param == "file"
    batch = job_from_openai(
        "/v1/audio/transcriptions", {"file": str(tmp_path / "a.wav")}, uploads=None, allow_paths=True
    )
    assert batch.inputs[0].path == str(tmp_path / "a.wav")
    assert (
        refused(
            "/v1/audio/transcriptions",
            {"file": ("a.wav", WAV), "response_format": "json", "timestamp_granularities[]": ["word"]},
            uploads,
        ).param
        == "timestamp_granularities"
    )


def test_images_write_into_the_request_folder_and_refuse_urls(uploads):
    spec = job_from_openai(
        "/v1/images/generations", {"prompt": "a 7", "n": 2, "size": "8x8", "seed": 1, "steps": 3}, uploads=uploads
    )
    assert spec.options == {"n": 2, "size": "8x8", "seed": 1, "steps": 3, "out_dir": str(uploads.dir)}
    assert (
        refused("/v1/images/generations", {"prompt": "a", "response_format": "url"}, uploads).param == "response_format"
    )
    assert refused("/v1/images/generations", {"prompt": "a", "n": 11}, uploads).param == "n"


def test_an_unknown_model_error_is_a_404():
    err = from_task_error(TaskError("no model named 'x': not an alias (minilm), not an existing path"))
    assert (err.status, err.code) == (404, "model_not_found")
    assert from_task_error(TaskError("--max-tokens must be at least 1")).status == 400


def test_ollama_options_map_to_generate_options(uploads):
    spec = ollama_api.generate_spec(
        {
            "model": "m",
            "prompt": "p",
            "system": "s",
            "format": "json",
            "options": {"num_predict": -1, "stop": "x", "temperature": 0.5, "top_k": 3},
        },
        uploads,
    )
    assert spec.options["max_tokens"] == ollama_api.UNLIMITED and spec.options["stop"] == ["x"]
    assert spec.options["system"] == "s" and Path(spec.options["json_schema"]).parent == uploads.dir
    with pytest.raises(APIError) as err:
        ollama_api.generate_spec({"prompt": "p", "options": {"mirostat": 1}}, uploads)
    assert err.value.param == "options.mirostat"
    chat = ollama_api.chat_spec(
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ]
        },
        uploads,
    )
    assert chat.options["history"] == [["user", "a"], ["assistant", "b"]] and chat.inputs[0].text == "c"


# --------------------------------------------------------------------------- wire, batching, settings


@pytest.mark.parametrize(
    "event",
    [
        ev.Token("He", 0),
        ev.Partial({"start": 0.0, "text": "hi"}, 1),
        ev.Step(3, 25, 0.08),
        ev.Progress(10, 40, "passages", "indexing"),
        ev.ItemError(1, "b.wav", "not audio"),
        ev.Item(0, "a", {"x": 1}),
    ],
)
def test_events_travel_as_json_lines_and_back(event):
    line = json.loads(json.dumps(wire.event_to_wire(event)))
    assert line["event"] == wire.EVENT_NAMES[type(event)]
    assert wire.event_from_wire(line) == event
    assert wire.event_to_wire(ev.Done(metrics=None)) is None


def test_no_server_path_leaves_in_a_line(uploads):
    inp = uploads.add(WAV, "talk.wav")
    line = {"input": inp.path, "annotated": str(uploads.dir / "annotated" / "x.png"), "other": "kept"}
    assert wire.scrub(line, [inp], uploads.dir) == {
        "input": "talk.wav",
        "annotated": "annotated/x.png",
        "other": "kept",
    }


def test_a_merged_embeddings_job_is_sliced_back_per_request():
    from taskrun.runner.jobs import JobRecord

    items = [ev.Item(i, f"input {i}", i * 10) for i in (0, 1, 2, 4, 5)]  # input 3 failed
    rec = JobRecord(
        id="r",
        task="embed",
        started_at="",
        items=items,
        errors=[ev.ItemError(3, "input 3", "bad")],
        status="partial",
        n_inputs=6,
    )
    mine = record_slice(rec, 2, 3)
    assert [(it.index, it.result) for it in mine.items] == [(0, 20), (2, 40)]
    assert [e.index for e in mine.errors] == [1] and mine.status == "partial" and mine.id == "r"
    assert (record_slice(rec, 5, 1).status, record_slice(rec, 3, 1).status) == ("ok", "failed")


def test_exposure_needs_a_key_or_no_auth():
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        assert is_loopback(host)
        check_exposure(host, None, False)
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.com"):
        assert not is_loopback(host)
        with pytest.raises(TaskError, match="--api-key"):
            check_exposure(host, None, False)
        check_exposure(host, "k", False)
        check_exposure(host, None, True)
    with pytest.raises(TaskError):
        check_exposure("127.0.0.1", "k", True)


def test_sizes_and_corpora(tmp_path):
    assert parse_size("8GB") == 8 * 10**9 and parse_size("512MiB") == 512 * 2**20 and parse_size(None) is None
    assert parse_size("2000") == 2000
    with pytest.raises(TaskError):
        parse_size("lots")
    assert parse_corpora((f"docs={tmp_path}",)) == {"docs": str(tmp_path.resolve())}
    for bad in ("docs", f"={tmp_path}", "docs=/no/such/folder"):
        with pytest.raises(TaskError):
            parse_corpora((bad,))


def test_earlier_turns_are_rendered_by_the_models_chat_template(tiny_dir):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.hf_engine import TransformersLLM
    from tests.tiny.generate import build

    llm = TransformersLLM.load(resolve(str(build(tiny_dir))), "cpu", "auto")
    history = (("user", "Capital of France?"), ("assistant", "Paris."))
    text = llm.decode(llm.prompt_ids("And of Italy?", "Be brief.", history=history), skip_special=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with pytest.raises(TaskError, match="chat template"):
        Options(history=history, raw=True)
    with pytest.raises(TaskError, match="role user or assistant"):
        Options(history=(("system", "x"),))
