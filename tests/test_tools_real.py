"""Tool calls from a real instruct model (marked real): Qwen2.5-Coder-0.5B through the real
`openai` and `ollama` clients against `run serve`, streamed and not.

Qwen2.5-Coder writes its calls as bare JSON (``{"name": ..., "arguments": ...}``) rather than in
``<tool_call>`` tags; both are calls (tasks/wire/tools.py). A streamed answer has the calls and
text of the same answer unstreamed, and its text is not held back to the end.
"""

from __future__ import annotations

import json

import ollama
import openai
import pytest

from tests.serve_helpers import shipped_server

pytestmark = pytest.mark.real

MODEL = "qwen2.5-coder-0.5b"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory, session_cache):
    with shipped_server(
        tmp_path_factory.mktemp("serve-tools-real"), session_cache, "--preload", MODEL, timeout=300
    ) as server:
        yield server.url


def test_openai_a_real_call_streamed_and_not(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    ask = dict(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0)
    whole = client.chat.completions.create(**ask).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = [c.choices[0] for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    streamed = [tc for c in chunks for tc in (c.delta.tool_calls or ())]
    assert [(t.index, t.function.name, t.function.arguments) for t in streamed] == [
        (0, "get_weather", call.function.arguments)
    ]
    assert chunks[-1].finish_reason == "tool_calls" and not any(c.delta.content for c in chunks)
    # the tool's result goes back (Qwen2.5-Coder tends to call again: its answer, whatever it
    # is, streams as the same text and calls as unstreamed)
    loop = [
        *ASK,
        whole.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    again = {**ask, "messages": loop, "max_tokens": 30}
    after = client.chat.completions.create(**again).choices[0]
    chunks = [c.choices[0] for c in client.chat.completions.create(**again, stream=True) if c.choices]
    text = "".join(c.delta.content or "" for c in chunks)
    calls = [(t.function.name, t.function.arguments) for c in chunks for t in (c.delta.tool_calls or ())]
    assert text == (after.message.content or "").strip() and chunks[-1].finish_reason == after.finish_reason
    assert calls == [(t.function.name, t.function.arguments) for t in after.message.tool_calls or ()]


def test_ollama_a_real_call_streamed_and_not(url):
    client = ollama.Client(host=url, timeout=300)
    ask = dict(model=MODEL, messages=ASK, tools=[WEATHER], options={"num_predict": 60, "temperature": 0})
    whole = client.chat(**ask, stream=False)
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and dict(call.function.arguments) == {"city": "Paris"}
    parts = list(client.chat(**ask, stream=True))
    calls = [c for p in parts for c in (p.message.tool_calls or ())]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert parts[-1].done and not parts[-1].message.tool_calls
