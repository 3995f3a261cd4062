"""`run serve` driven as its users drive it: the real `openai` and `ollama` packages, curl as the
docs/serve.md shows it, and the native endpoint; answers compared with the CLI's own.

One server subprocess (tiny models, 127.0.0.1, a free port) serves the whole session; a second,
keyed one with a queue of one and a 1 MB body limit serves tests/test_serve_ops.py.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess

import httpx
import jsonschema
import numpy as np
import openai
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main

pytest.register_assert_rewrite("tests.serve_helpers")  # it is also this module's plugin (below)
from tests.serve_helpers import run_log_row  # noqa: E402 (after its assert rewrite is registered)

# The servers are session fixtures, shared by every server test module: registered as a plugin.
pytest_plugins = ["tests.serve_helpers"]


@pytest.fixture
def server(servers):
    return servers[0]


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def cli(serve_env, monkeypatch):
    """The CLI in this process, on the server's models.toml: the answers to compare with."""
    monkeypatch.setenv("TASKRUN_MODELS_TOML", str(serve_env[1]))

    def run(*args) -> dict:
        r = CliRunner().invoke(main, [*args, "--json", "-q"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    return run


def curl(*args: str) -> str:
    return subprocess.run(
        ["curl", "-s", "--fail-with-body", *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


# --------------------------------------------------------------------------- OpenAI: text


def test_models_lists_each_model_with_its_tasks_and_digest(client):
    models = {m.id: m for m in client.models.list()}
    assert {"tiny-llama", "tiny-bert", "tiny-whisper", "digits-ddpm"} <= set(models)
    assert models["tiny-bert"].model_extra["tasks"] == ["embed", "search", "classify"]
    assert models["tiny-llama"].model_extra["digest"].startswith("sha256:")


def test_chat_answers_as_the_cli_does_with_usage_and_the_run_id(client, cli, server):
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        seed=1,
    )
    chat = raw.parse()
    local = cli("generate", "What is the capital of France?", "--model", "tiny-llama", "--max-tokens", "8")
    result = local["items"][0]["result"]
    assert chat.choices[0].message.content == result["text"]
    assert chat.choices[0].finish_reason == {"stop_sequence": "stop"}.get(
        result["finish_reason"], result["finish_reason"]
    )
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (result["input_tokens"], result["output_tokens"])
    row = run_log_row(server, raw.headers["x-taskrun-run-id"])
    assert row["status"] == "ok" and row["task"] == "generate" and row["model"] == "tiny-llama"


def test_chat_streams_the_same_text_then_usage(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to ten."}]
    whole = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=12)
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama", messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(chunks) > 3
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert chunks[-1].model_extra["run_id"]


def test_earlier_turns_reach_the_model_through_its_chat_template(client):
    question = {"role": "user", "content": "And of Italy?"}
    alone = client.chat.completions.create(model="tiny-llama", messages=[question], max_tokens=2)
    turns = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]
    both = client.chat.completions.create(model="tiny-llama", messages=turns + [question], max_tokens=2)
    # <|im_start|>user\n…<|im_end|>\n per turn: the template wrapped each earlier turn
    assert both.usage.prompt_tokens > alone.usage.prompt_tokens + 8


def test_a_conversation_resent_by_a_chat_client_reads_only_its_new_turn(client):
    """llama.cpp's prompt cache through the OpenAI API: the second request repeats the first
    conversation and adds a turn; its usage says how many prompt tokens were kept, as OpenAI's
    own prompt caching does (prompt_tokens_details.cached_tokens)."""
    pytest.importorskip("llama_cpp")
    turns = [
        {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France, the country in western Europe?"},
    ]
    first = client.chat.completions.create(model="tiny-gguf", messages=turns, max_tokens=4, seed=1)
    more = turns + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And of Germany?"},
    ]
    second = client.chat.completions.create(model="tiny-gguf", messages=more, max_tokens=4, seed=1)
    kept = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= kept < second.usage.prompt_tokens  # the first turn, not the new one
    other = client.chat.completions.create(model="tiny-llama", messages=turns, max_tokens=2)
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # transformers keeps no prompt cache


def test_json_schema_answer_validates(client):
    # the grammar (pipelines/llm/grammar.py) makes the answer valid by construction, even a random model's
    # (bounded: a random model never closes a string or an object by itself)
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "capital": {"type": "boolean"},
            "size": {"enum": ["small", "large"]},
        },
        "required": ["city", "capital", "size"],
        "additionalProperties": False,
    }
    chat = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Describe Paris."}],
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    jsonschema.validate(json.loads(chat.choices[0].message.content), schema)


def test_completions_take_several_prompts_raw(client):
    out = client.completions.create(model="tiny-llama", prompt=["The capital of", "Count:"], max_tokens=4)
    assert [c.index for c in out.choices] == [0, 1] and all(c.text for c in out.choices)
    assert out.usage.completion_tokens <= 8


# --------------------------------------------------------------------------- OpenAI: embeddings, audio, images


def test_embeddings_float_and_base64_equal_the_cli(client, cli, server):
    texts = ["the cat", "a dog", "stock prices"]
    local = np.array([it["result"]["vector"] for it in cli("embed", *texts, "--model", "tiny-bert")["items"]])
    floats = client.embeddings.create(model="tiny-bert", input=texts, encoding_format="float")
    b64 = client.embeddings.create(model="tiny-bert", input=texts)  # the client asks base64 and decodes it
    raw = httpx.post(
        server.url + "/v1/embeddings",
        timeout=30,
        json={"model": "tiny-bert", "input": texts, "encoding_format": "base64"},
    ).json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]]
    for got in ([d.embedding for d in floats.data], [d.embedding for d in b64.data], decoded):
        assert np.abs(np.array(got) - local).max() < 1e-5
    assert floats.usage.prompt_tokens == sum(
        it["result"]["tokens"] for it in cli("embed", *texts, "--model", "tiny-bert")["items"]
    )


def test_transcription_as_srt_and_verbose_json(client, tiny_dir):
    import pysrt

    from tests.tiny.whisper import clip

    with open(clip(tiny_dir), "rb") as f:  # (language given: no detector runs for an English-only model)
        srt = client.audio.transcriptions.create(model="tiny-whisper", file=f, response_format="srt", language="en")
    cues = pysrt.from_string(srt)  # a random model's words, but a well-formed file
    assert all(0 <= c.start.ordinal <= c.end.ordinal <= 3400 for c in cues)
    with open(clip(tiny_dir), "rb") as f:
        verbose = client.audio.transcriptions.create(
            model="tiny-whisper",
            file=f,
            response_format="verbose_json",
            language="en",
            timestamp_granularities=["segment"],
        )
    assert verbose.duration == pytest.approx(3.4, abs=0.01) and verbose.language == "en"
    for seg in verbose.segments:
        assert 0 <= seg.start <= seg.end <= verbose.duration


def test_image_comes_back_as_a_b64_png(client):
    from PIL import Image

    out = client.images.generate(
        model="digits-ddpm", prompt="a 7", n=2, response_format="b64_json", extra_body={"seed": 3, "steps": 2}
    )
    assert len(out.data) == 2
    for d in out.data:
        with Image.open(io.BytesIO(base64.b64decode(d.b64_json))) as im:
            assert im.format == "PNG" and im.size == (8, 8) and im.text["label"] == "7"
    assert {Image.open(io.BytesIO(base64.b64decode(d.b64_json))).text["seed"] for d in out.data} == {"3", "4"}


# --------------------------------------------------------------------------- native and curl


def test_native_classify_equals_the_cli_json(server, cli):
    body = {"input": ["good movie", "bad movie"], "options": {"labels": ["good", "bad"]}, "model": "tiny-bert"}
    got = json.loads(
        curl(f"{server.url}/v1/tasks/classify", "-H", "Content-Type: application/json", "-d", json.dumps(body))
    )
    local = cli("classify", "good movie", "bad movie", "--labels", "good,bad", "--model", "tiny-bert")
    assert [it["result"] for it in got["items"]] == [it["result"] for it in local["items"]]
    assert got["options"] == local["options"] and got["model"] == {**local["model"], "path": None}  # no server path
    assert run_log_row(server, got["id"])["status"] == "ok"


def test_native_search_names_a_corpus_the_operator_served(server, serve_env, cli):
    body = {"input": "kitten", "options": {"corpus": "docs", "top_k": 1}, "model": "tiny-bert"}
    got = httpx.post(server.url + "/v1/tasks/search", json=body, timeout=60).json()
    local = cli("search", "kitten", "--corpus", str(serve_env[2]), "-k", "1", "--model", "tiny-bert")
    assert [it["result"] for it in got["items"]] == [it["result"] for it in local["items"]]


def test_native_detect_takes_an_uploaded_image_and_returns_its_drawing(server, tiny_dir):
    from PIL import Image

    from tests.tiny.vision import picture

    data = base64.b64encode(picture(tiny_dir / "tiny-images").read_bytes()).decode()
    job = httpx.post(
        server.url + "/v1/tasks/detect",
        timeout=60,
        json={
            "input": {"data": data, "name": "shapes.png"},
            "model": "tiny-yolos",
            "options": {"threshold": 0, "annotate": True},
        },
    ).json()
    (item,) = job["items"]
    assert item["input"] == "shapes.png" and (item["result"]["width"], item["result"]["height"]) == (96, 64)
    (drawing,) = job["files"]
    assert drawing["name"] == item["result"]["annotated"]
    with Image.open(io.BytesIO(base64.b64decode(drawing["data"]))) as im:
        assert im.size == (96, 64)


def test_native_stream_sends_events_then_the_job(server):
    lines = []
    with httpx.stream(
        "POST",
        server.url + "/v1/tasks/generate",
        timeout=60,
        json={"input": "Hello", "model": "tiny-llama", "options": {"max_tokens": 6}, "stream": True},
    ) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    kinds = [line["event"] for line in lines]
    assert kinds[-1] == "done" and "token" in kinds and "item" in kinds
    job = lines[-1]["job"]
    assert "".join(line["text"] for line in lines if line["event"] == "token") == job["items"][0]["result"]["text"]
    assert job["status"] == "ok" and job["metrics"]["output_tokens"] <= 6 and lines[-1]["files"] == []


def test_native_image_returns_its_files_by_name(server):
    job = httpx.post(
        server.url + "/v1/tasks/image", timeout=60, json={"input": "a 3", "options": {"steps": 2, "seed": 5}}
    ).json()
    (name,) = job["items"][0]["result"]["images"][0]["files"]
    assert [f["name"] for f in job["files"]] == [name] and "/" not in name
    assert base64.b64decode(job["files"][0]["data"]).startswith(b"\x89PNG")


def test_curl_chat_and_embeddings_as_the_readme_shows(server):
    chat = json.loads(
        curl(
            f"{server.url}/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}',
        )
    )
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] <= 5
    stream = curl(
        "-N",
        f"{server.url}/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": true}',
    )
    events = [line.removeprefix("data: ") for line in stream.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"]
    emb = json.loads(
        curl(
            f"{server.url}/v1/embeddings",
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"model": "tiny-bert", "input": "hello world"}',
        )
    )
    assert len(emb["data"][0]["embedding"]) == 32


# --------------------------------------------------------------------------- Ollama


def test_ollama_generate_chat_embed_and_tags(server, client):
    import ollama

    o = ollama.Client(host=server.url)
    assert "tiny-llama" in {m.model for m in o.list().models}
    gen = o.generate(
        model="tiny-llama", prompt="Why is the sky blue?", options={"num_predict": 6, "seed": 1}, stream=False
    )
    assert gen.done and gen.done_reason in ("stop", "length") and 0 < gen.eval_count <= 6
    assert gen.total_duration >= gen.load_duration and gen.prompt_eval_count > 0 and gen.eval_duration > 0
    parts = list(o.generate(model="tiny-llama", prompt="Why is the sky blue?", options={"num_predict": 6}, stream=True))
    assert "".join(p.response for p in parts) == gen.response and parts[-1].done
    chat = o.chat(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Why is the sky blue?"}],
        options={"num_predict": 6},
        stream=False,
    )
    assert chat.message.role == "assistant" and chat.message.content == gen.response
    vecs = o.embed(model="tiny-bert", input=["the cat", "a dog"]).embeddings
    ref = client.embeddings.create(model="tiny-bert", input=["the cat", "a dog"])
    assert np.abs(np.array(vecs) - np.array([d.embedding for d in ref.data])).max() < 1e-5
