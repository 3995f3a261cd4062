"""Ollama's surface beyond generation, driven by the real `ollama` client (and the bodies litellm
and LangChain send) against `run serve` (tests/serve_helpers.py): GET /, version, show, ps,
:latest, the legacy /api/embeddings, pull/delete refused, errors in Ollama's shape, neutral
values accepted."""

from __future__ import annotations

import httpx
import ollama
import pytest

pytest_plugins = ["tests.serve_helpers"]


@pytest.fixture
def url(servers):
    return servers[0].url


@pytest.fixture
def client(url):
    return ollama.Client(host=url, timeout=60)


def test_the_root_says_ollama_is_running(url):
    r = httpx.get(url + "/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert httpx.head(url + "/").status_code == 200


def test_version_show_and_ps(client):
    assert httpx.get(str(client._client.base_url) + "/api/version").json()["version"]  # ollama 0.6.3 has no .version()
    shown = client.show("tiny-llama:latest")
    assert "completion" in shown.capabilities and shown.details.family
    client.generate(model="tiny-llama:latest", prompt="hi", options={"num_predict": 2})
    assert "tiny-llama" in [m.model for m in client.ps().models]
    with pytest.raises(ollama.ResponseError) as err:
        client.show("no-such-model")
    assert err.value.status_code == 404 and err.value.error == "model 'no-such-model' not found"


def test_show_answers_a_go_template_and_keeps_the_jinja_one(client, url, monkeypatch):
    """Ollama's /api/show template is a Go template; litellm's ollama/ provider reads it only for
    "tools" (whether the model calls tools) and model_info for the window. The model's own Jinja
    template stays under model_info's tokenizer.chat_template."""
    from tests.tiny.generate import CHAT_TEMPLATE, CONTEXT

    shown = client.show("tiny-llama")
    assert shown.template.startswith("{{ $prev") and "{%" not in shown.template
    for part in ("<|im_start|>user\n{{ $m.Content }}<|im_end|>", "{{ json $t }}", "<tool_response>"):
        assert part in shown.template, part
    assert shown.template.endswith("<|im_start|>assistant\n")
    assert shown.modelinfo["tokenizer.chat_template"] == CHAT_TEMPLATE
    assert shown.capabilities == ["completion", "tools"]  # as Ollama: its template renders tools
    assert client.show("tiny-bert").capabilities == ["embedding"]
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price map fetched from GitHub
    from litellm.llms.ollama.common_utils import OllamaModelInfo

    info = OllamaModelInfo().get_model_info("ollama/tiny-llama", api_base=url)
    assert info["supports_function_calling"] is True and info["max_input_tokens"] == CONTEXT


@pytest.mark.parametrize(
    "jinja, marks",
    [
        ("{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\\n' }}", ["You are Qwen"]),
        ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>", ["named SmolLM<|im_end|>"]),
        ("{{ bos_token }}<start_of_turn>user\n", ["<start_of_turn>model\n{{ $m.Content }}", "{{ if $first }}"]),
    ],
)
def test_the_go_template_of_each_family_taskrun_ships(jinja, marks):
    from taskrun.tasks.wire.ollama_info import go_template

    out = go_template(jinja)
    assert ".Tools" in out and all(m in out for m in marks), out
    assert go_template("{{ messages }}") == ""  # a format taskrun does not know: no Go template


def test_errors_come_in_ollamas_shape(url):
    r = httpx.post(url + "/api/chat", json={"model": "tiny-llama", "messages": "hi", "stream": False})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = httpx.post(url + "/api/pull", json={"model": "llama3"})
    assert r.status_code == 400 and "does not download" in r.json()["error"]
    r = httpx.request("DELETE", url + "/api/delete", json={"model": "tiny-llama"})
    assert r.status_code == 400 and "does not delete" in r.json()["error"]
    # the OpenAI side keeps OpenAI's shape
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny-llama", "messages": []})
    assert isinstance(r.json()["error"], dict)


def test_neutral_values_are_accepted_as_litellm_and_langchain_send_them(url):
    # litellm ollama_chat/ sends "images": [] on every message
    chat = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "hi", "images": []}],
        "options": {"num_predict": 2, "mirostat": None},
        "stream": False,
    }
    r = httpx.post(url + "/api/chat", json=chat, timeout=60)
    assert r.status_code == 200, r.text
    # LangChain's OllamaEmbeddings sends every option, unset ones as null
    body = {"model": "tiny-bert", "input": ["a note"], "options": {"mirostat": None, "num_ctx": None}}
    r = httpx.post(url + "/api/embed", json=body, timeout=60)
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1
    # an option with an effect taskrun lacks is still refused by name
    body["options"] = {"mirostat": 2}
    r = httpx.post(url + "/api/embed", json=body, timeout=60)
    assert r.status_code == 400 and "options" in r.json()["error"]


def test_the_legacy_embeddings_endpoint(client, url):
    r = httpx.post(url + "/api/embeddings", json={"model": "tiny-bert:latest", "prompt": "a note"}, timeout=60)
    assert r.status_code == 200
    vector = r.json()["embedding"]
    assert vector == client.embed(model="tiny-bert", input="a note").embeddings[0]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The forecast.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_chat_tools_answer_in_ollamas_tool_calls_shape(tmp_path):
    from types import SimpleNamespace

    from taskrun.tasks.wire import ollama_api as ol
    from taskrun.tasks.wire.jobspec import Uploads

    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather", "arguments": {}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "weather"},
    ]
    with Uploads() as uploads:
        spec = ol.chat_spec({"model": "m", "messages": history, "tools": [WEATHER_TOOL]}, uploads)
    assert "<tools>" in spec.options["system"] and spec.inputs[0].text == "<tool_response>\nsunny\n</tool_response>"
    asked = ol.chat_tools({"tools": [WEATHER_TOOL]})
    said = SimpleNamespace(
        text='<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>',
        json=None,
        finish_reason="stop",
    )
    rec = SimpleNamespace(results=[said], metrics=None, load_s=0.0, wall_s=0.0, id="r")
    line = ol.final_line(True, "m", rec, 0.0, asked=asked)
    assert line["message"]["tool_calls"] == [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}]
    assert line["message"]["content"] == ""


def test_the_ollama_client_sends_tools_and_gets_the_text_as_it_is_written(client):
    # a random model chooses no tool by itself: its text streams line by line, as without tools,
    # and is the text of the same answer unstreamed
    ask = dict(
        model="slow-llama",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        options={"num_predict": 8, "temperature": 0},
    )
    parts = list(client.chat(**ask, stream=True))
    whole = client.chat(**ask, stream=False)
    assert len(parts) > 2 and parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content.strip()
    assert not whole.message.tool_calls


@pytest.mark.parametrize(
    "value, seconds", [(None, None), (0, 0.0), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("-1", -1.0), (-1, -1.0)]
)
def test_keep_alive_reads_as_ollama_reads_it(value, seconds):
    from taskrun.tasks.wire import ollama_api as ol

    assert ol.keep_alive({"keep_alive": value}) == seconds


@pytest.mark.parametrize("value", ["bogus", "5 minutes", True, [1]])
def test_a_bad_keep_alive_is_a_400(url, value):
    body = {"model": "tiny-llama", "prompt": "hi", "stream": False, "keep_alive": value}
    r = httpx.post(url + "/api/generate", json=body, timeout=60)
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]


def test_keep_alive_0_unloads_after_the_request(client):
    client.generate(model="tiny-llama", prompt="hi", options={"num_predict": 2})
    assert "tiny-llama" in [m.model for m in client.ps().models]
    client.generate(model="tiny-llama", prompt="hi", options={"num_predict": 2}, keep_alive=0)
    assert "tiny-llama" not in [m.model for m in client.ps().models]


def test_the_load_and_unload_idiom(client):
    loaded = client.generate(model="tiny-llama")  # no prompt: load
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert "tiny-llama" in [m.model for m in client.ps().models]
    gone = client.chat(model="tiny-llama:latest", messages=[], keep_alive=0)  # no messages, keep_alive 0: unload
    assert gone.done and gone.done_reason == "unload"
    assert "tiny-llama" not in [m.model for m in client.ps().models]


def test_num_ctx_sets_the_requests_window(client):
    """options.num_ctx is this request's window (prompt + answer), as in Ollama: the answer stops
    where the window is full; a prompt longer than it is refused naming it; more than the model
    reads is cut to the model's own window; a value that is no size is a 400 naming the field."""
    prompt = "Count: one two three four five six seven eight nine ten"
    first = client.generate(model="tiny-llama", prompt=prompt, options={"num_predict": 2, "temperature": 0})
    n = first.prompt_eval_count
    r = client.generate(model="tiny-llama", prompt=prompt, options={"num_ctx": n + 3, "num_predict": 50, "seed": 1})
    assert r.prompt_eval_count == n and r.eval_count == 3 and r.done_reason == "length"
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model="tiny-llama", prompt=prompt, options={"num_ctx": n - 1})
    assert err.value.status_code == 400 and f"reads at most {n - 1}" in err.value.error
    big = client.generate(model="tiny-llama", prompt=prompt, options={"num_ctx": 10_000_000, "num_predict": 4})
    assert big.eval_count <= 4 and big.done
    url = str(client._client.base_url)
    for bad in (0, -5, 1.5, "big"):  # sent raw: the ollama client checks types itself
        body = {"model": "tiny-llama", "prompt": prompt, "stream": False, "options": {"num_ctx": bad}}
        r = httpx.post(url + "/api/generate", json=body, timeout=60)
        assert r.status_code == 400 and "num_ctx" in r.json()["error"], (bad, r.text)
