"""The clients users already run, real packages against a real `run serve` subprocess (the
session's open server, tests/serve_helpers.py): litellm (`openai/`, `ollama_chat/`, `ollama/`),
LangChain (ChatOpenAI, OpenAIEmbeddings, ChatOllama, OllamaEmbeddings) and simonw's `llm` (a model
declared in extra-openai-models.yaml under a private LLM_USER_PATH). Pinned in pyproject's dev extras.

Decoding is greedy unless asked otherwise, so a client's plain answer must equal the answer to the
same request sent as raw HTTP: a client that drops or mangles a field shows up as a different text.
Tool calls use slow-llama (tiny-llama's 512-token window cannot hold a tool's signature) with a
closed schema: the grammar holds a forced call to it, and a random model's free key would never end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict

pytest_plugins = ["tests.serve_helpers"]

CHAT = "tiny-llama"
TOOL_MODEL = "slow-llama"
EMBED = "tiny-bert"
HI = [{"role": "user", "content": "hi"}]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The forecast.", "parameters": CITY}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALLED = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    ],
}
LOOP = [*ASK, CALLED, {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


class Weather(BaseModel):
    """The forecast for a city."""

    model_config = ConfigDict(extra="forbid")  # additionalProperties: false
    city: Literal["Paris", "Oslo"]


@pytest.fixture(scope="module")
def url(servers):
    return servers[0].url


@pytest.fixture(scope="module")
def reference(url):
    """The raw-HTTP answer to 'hi' in 5 tokens, which every client's plain chat must repeat."""
    r = httpx.post(url + "/v1/chat/completions", json={"model": CHAT, "messages": HI, "max_tokens": 5}, timeout=60)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert text
    return text


@pytest.fixture(scope="module")
def litellm():
    # its model-price map is fetched from GitHub on import unless told to read its bundled copy
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.telemetry = False
    return litellm


def test_litellm_openai_chat_stream_tools_and_embeddings(litellm, url, reference):
    base = {"model": f"openai/{CHAT}", "api_base": url + "/v1", "api_key": "unused", "max_tokens": 5}
    assert litellm.completion(messages=HI, **base).choices[0].message.content == reference
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(messages=HI, stream=True, **base)]
    assert "".join(pieces) == reference
    tool = {**base, "model": f"openai/{TOOL_MODEL}", "max_tokens": 64}
    answer = litellm.completion(messages=ASK, tools=TOOLS, tool_choice="required", **tool).choices[0]
    assert answer.finish_reason == "tool_calls" and answer.message.tool_calls[0].function.name == "weather"
    jsonschema.validate(json.loads(answer.message.tool_calls[0].function.arguments), CITY)
    # the tool's result goes back and the model answers in words
    after = litellm.completion(messages=LOOP, tools=TOOLS, **{**tool, "max_tokens": 4}).choices[0]
    assert after.finish_reason == "length" and after.message.content
    vectors = litellm.embedding(model=f"openai/{EMBED}", api_base=url + "/v1", api_key="unused", input=["a", "b"])
    assert len(vectors.data) == 2 and len(vectors.data[0]["embedding"]) == 32


def test_litellm_ollama_chat_sends_what_ollama_takes(litellm, url, reference):
    # ollama_chat/ sends "images": [] on every message and maps max_tokens to options.num_predict
    base = {"model": f"ollama_chat/{CHAT}", "api_base": url, "max_tokens": 5}
    assert litellm.completion(messages=HI, **base).choices[0].message.content == reference
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(messages=HI, stream=True, **base)]
    assert "".join(pieces) == reference
    # Ollama has no tool_choice (litellm drops it), so a random model never calls by itself: the
    # tools and a call's history (arguments as an object, the tool's answer) must still be taken
    tool = {**base, "model": f"ollama_chat/{TOOL_MODEL}", "max_tokens": 4}
    after = litellm.completion(messages=LOOP, tools=TOOLS, **tool).choices[0]
    assert after.message.content and not after.message.tool_calls
    vectors = litellm.embedding(model=f"ollama/{EMBED}", api_base=url, input=["a", "b"])
    assert len(vectors.data) == 2 and len(vectors.data[0]["embedding"]) == 32


def test_litellm_ollama_generate_route(litellm, url):
    # ollama/ renders its own "### User:" prompt and posts /api/generate, which (as Ollama does)
    # wraps it in the model's chat template; the same prompt raw over HTTP gives the same text
    base = {"model": f"ollama/{CHAT}", "api_base": url, "max_tokens": 5}
    text = litellm.completion(messages=HI, **base).choices[0].message.content
    raw = httpx.post(
        url + "/api/generate",
        json={"model": CHAT, "prompt": "### User:\nhi\n\n", "stream": False, "options": {"num_predict": 5}},
        timeout=60,
    )
    assert text and text == raw.json()["response"]
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(messages=HI, stream=True, **base)]
    assert "".join(pieces) == text


def test_langchain_openai(url, reference):
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    chat = ChatOpenAI(base_url=url + "/v1", api_key="unused", model=CHAT, max_tokens=5, max_retries=0)
    assert chat.invoke("hi").content == reference
    assert "".join(c.content for c in chat.stream("hi")) == reference
    tools = ChatOpenAI(base_url=url + "/v1", api_key="unused", model=TOOL_MODEL, max_tokens=64, max_retries=0)
    calls = tools.bind_tools([Weather], tool_choice="Weather").invoke("Weather in Paris?").tool_calls
    assert calls[0]["name"] == "Weather" and calls[0]["args"]["city"] in ("Paris", "Oslo")
    got = tools.with_structured_output(Weather, method="function_calling").invoke("Weather in Paris?")
    assert isinstance(got, Weather)
    # OpenAI's token-length check downloads tiktoken's cl100k table: off for any other server
    embeddings = OpenAIEmbeddings(
        base_url=url + "/v1", api_key="unused", model=EMBED, check_embedding_ctx_length=False, max_retries=0
    )
    assert [len(v) for v in embeddings.embed_documents(["a", "b"])] == [32, 32]
    assert len(embeddings.embed_query("a")) == 32


def test_langchain_ollama(url, reference):
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_ollama import ChatOllama, OllamaEmbeddings

    chat = ChatOllama(base_url=url, model=CHAT, num_predict=5)
    assert chat.invoke("hi").content == reference
    assert "".join(c.content for c in chat.stream("hi")) == reference
    # ChatOllama's structured output is Ollama's `format` (a JSON schema), held by the grammar
    tools = ChatOllama(base_url=url, model=TOOL_MODEL, num_predict=64)
    assert isinstance(tools.with_structured_output(Weather, method="json_schema").invoke("Weather?"), Weather)
    loop = [
        HumanMessage("Weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "Weather", "args": {"city": "Paris"}, "id": "call_1"}]),
        ToolMessage("sunny, 21 C", tool_call_id="call_1"),
    ]
    after = ChatOllama(base_url=url, model=TOOL_MODEL, num_predict=4).bind_tools([Weather]).invoke(loop)
    assert after.content and not after.tool_calls
    # OllamaEmbeddings sends options full of nulls (mirostat: null, ...)
    embeddings = OllamaEmbeddings(base_url=url, model=EMBED)
    assert [len(v) for v in embeddings.embed_documents(["a", "b"])] == [32, 32]
    assert len(embeddings.embed_query("a")) == 32


def llm_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LLM_"))}
    env["LLM_USER_PATH"] = str(home)  # never the real ~/.config/io.datasette.llm
    return subprocess.run(
        [str(Path(sys.executable).parent / "llm"), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_llm_with_extra_openai_models_yaml(url, reference, tmp_path):
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: taskrun-tiny\n  model_name: {CHAT}\n  api_base: {url}/v1\n  api_key: unused\n"
    )
    for stream in ((), ("--no-stream",)):
        done = llm_cli(home, "-m", "taskrun-tiny", "hi", "-o", "max_tokens", "5", *stream)
        assert done.returncode == 0, done.stderr
        assert done.stdout == reference + "\n"
    # llm's YAML declares chat models only: `llm embed` knows OpenAI's embedding names alone
    done = llm_cli(home, "embed", "-m", EMBED, "-c", "hi")
    assert done.returncode != 0 and "embedding model" in done.stderr


def test_ollama_tags_and_show_say_size_quantisation_template_and_window(litellm, url, monkeypatch):
    import ollama

    client = ollama.Client(host=url, timeout=60)
    listed = {m.model: m.details for m in client.list().models}
    if "tiny-gguf" in listed:  # llama-cpp-python installed: a GGUF's header gives both
        assert (listed["tiny-gguf"].parameter_size, listed["tiny-gguf"].quantization_level) == ("31K", "F32")
        shown = client.show("tiny-gguf")
        assert shown.details.parameter_size == "31K" and "<|im_start|>" in shown.template
        assert shown.modelinfo["llama.context_length"] == 512
    shown = client.show("tiny-llama:latest")
    assert "<|im_start|>" in shown.template and shown.modelinfo["llama.context_length"] == 512
    # litellm reads its context window (and tool support) from /api/show
    monkeypatch.setenv("OLLAMA_API_BASE", url)
    assert litellm.get_model_info(f"ollama/{CHAT}")["max_input_tokens"] == 512


def test_chat_info_reads_tokenizer_config_and_says_nothing_where_there_is_nothing(tmp_path):
    from taskrun.models.chat_info import chat_info

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 32768}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ tools }}"}))
    assert chat_info(str(tmp_path)) == {"family": "qwen2", "template": "{{ tools }}", "context_length": 32768}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert chat_info(str(empty)) == {"family": "", "template": "", "context_length": 0}
    assert chat_info(str(tmp_path / "gone.gguf"))["template"] == ""
