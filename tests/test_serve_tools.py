"""Tool calling on /v1/chat/completions, driven by the real `openai` client against `run serve`
(the session's tiny-model server, tests/serve_helpers.py), and the wire layer's parsing of the
Hermes-format answer (tasks/wire/tools.py).

A tiny random model never chooses a tool by itself, so `auto` is covered by the parser on
written answers; `required` and a named function are covered end to end: the grammar makes a
random model's call schema-valid.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import openai
import pytest

from taskrun.tasks.wire import tools
from taskrun.tasks.wire.errors import APIError
from taskrun.tasks.wire.jobspec import Uploads
from taskrun.tasks.wire.openai_api import job_from_openai
from taskrun.tasks.wire.tool_stream import ToolStream

pytest_plugins = ["tests.serve_helpers"]

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "description": "The forecast.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
# slow-llama: tiny-llama's 512-token window cannot hold the tools' signatures (a near per-character
# vocabulary); this one has 8k, and the grammar ends its answer where the JSON closes
MODEL = "slow-llama"
ASK = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]


@pytest.fixture
def client(servers):
    return openai.OpenAI(base_url=servers[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)


def answer(text: str, json_value=None):
    return SimpleNamespace(text=text, json=json_value, finish_reason="stop", input_tokens=3, output_tokens=5)


# --------------------------------------------------------------------------- the wire layer


def test_a_hermes_answer_becomes_tool_calls_and_the_text_around_them_stays():
    asked = tools.tool_request({"tools": TOOLS})
    text = 'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
    content, calls = asked.calls(answer(text + '\n<tool_call>{"name": "noop", "arguments": {}}</tool_call>'))
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["weather", "noop"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    # parallel_tool_calls false keeps the first call; an unknown function stays text
    one = tools.tool_request({"tools": TOOLS, "parallel_tool_calls": False})
    assert len(one.calls(answer(text + '<tool_call>{"name": "noop", "arguments": {}}</tool_call>'))[1]) == 1
    unknown = '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    assert asked.calls(answer(unknown)) == (unknown, [])


def test_tool_results_go_back_as_tool_response_turns(tmp_path):
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
    ]
    with Uploads() as uploads:
        spec = job_from_openai("/v1/chat/completions", {"messages": messages, "tools": TOOLS}, uploads=uploads)
    assert spec.inputs[0].text == "<tool_response>\nsunny, 21 C\n</tool_response>"
    assert spec.options["history"][1] == [
        "assistant",
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ]
    assert "<tools>" in spec.options["system"] and '"name": "weather"' in spec.options["system"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": "weather"}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_tool_fields_are_named(extra, param):
    with Uploads() as uploads, pytest.raises(APIError) as err:
        job_from_openai("/v1/chat/completions", {"messages": ASK, **extra}, uploads=uploads)
    assert err.value.param == param


def test_a_tool_message_must_answer_a_call():
    with pytest.raises(APIError) as err:
        job_from_openai("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, uploads=None)
    assert err.value.param == "messages[0].role"


WRITTEN = [
    'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
    '\n<tool_call>{"name": "noop", "arguments": {}}</tool_call>',
    "  No tool is needed: it is 21 C.\n",
    'A <tool_call>{"name": "rm", "arguments": {}}</tool_call> B <tool',
    'Checking <tool_call>{"name": "weather", "arguments": {"city": "Paris", "days": 1}}',  # cut short
    '<tool_call>{"name": "noop", "arguments": {}}</tool_call>\nDone, and <tool_call> is a tag.',
    # bare JSON calls, as Qwen2.5-Coder writes them, fenced or not; and JSON that is no call
    '{"name": "weather", "arguments": {"city": "Paris", "days": 3}}',
    '```json\n{"name": "noop", "arguments": {}}\n{"name": "weather", "arguments": {"city": "Oslo"}}\n```',
    '{"name": "hello", "arguments": {"language": "fr"}}',
    '{"name": "noop", "arguments": {}} and then <tool_call>{"name": "noop", "arguments": {}}</tool_call>',
    "```python\nprint(1)\n```",
]


@pytest.mark.parametrize("text", WRITTEN)
@pytest.mark.parametrize("parallel", [True, False])
def test_a_streamed_answer_has_the_text_and_calls_of_the_whole_one(text, parallel):
    asked = tools.tool_request({"tools": TOOLS, "parallel_tool_calls": parallel})
    content, calls = asked.calls(answer(text))
    for step in (1, 2, 5, 11, len(text)):
        stream = ToolStream(asked)
        parts = [p for i in range(0, len(text), step) for p in stream.feed(text[i : i + step])]
        parts += stream.close(answer(text))
        got_text = "".join(v for k, v in parts if k == "text")
        got_calls = [v["function"] for k, v in parts if k == "call"]
        assert got_text == (content or "").strip(), step
        assert got_calls == [c["function"] for c in calls], step
        assert stream.calls >= len(calls)


def test_a_bare_json_call_is_a_call_and_other_text_is_not_held_for_it():
    asked = tools.tool_request({"tools": TOOLS})
    content, calls = asked.calls(answer('{"name": "weather", "arguments": {"city": "Paris", "days": 3}}'))
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 3}
    stream = ToolStream(asked)
    assert stream.feed('{"name": "wea') == [] and stream.feed('ther", "arguments": {') == []  # held
    # an unknown function, or text that starts otherwise, streams as soon as that is known
    other = ToolStream(asked)
    assert other.feed('{"name": "no') == [] and other.feed('pe"') == [("text", '{"name": "nope"')]
    assert ToolStream(asked).feed("Paris is") == [("text", "Paris is")]


def test_text_is_passed_on_as_written_and_a_call_as_soon_as_it_closes():
    """Only what may be the start of <tool_call> is held back; a call is not held to the end."""
    stream = ToolStream(tools.tool_request({"tools": TOOLS}))
    assert stream.feed("It is sunny") == [("text", "It is sunny")]
    assert stream.feed(" <tool") == []  # a tag may be starting
    assert stream.feed("s> are") == [("text", " <tools> are")]
    assert stream.feed(' <tool_call>{"name": "noop", "arguments": {}') == []  # inside a call
    ((kind, call),) = stream.feed("}</tool_call>")
    assert kind == "call" and call["function"] == {"name": "noop", "arguments": "{}"}
    # under a grammar (required, named) the whole answer is the call: nothing before its end
    required = ToolStream(tools.tool_request({"tools": TOOLS, "tool_choice": "required"}))
    assert required.feed('{"name": "noop", ') == []
    done = required.close(answer("", json_value={"name": "noop", "arguments": {}}))
    assert [k for k, _ in done] == ["call"] and required.calls == 1


def test_completion_chunks_stream_text_then_each_call_then_the_finish():
    from taskrun.tasks.wire.openai_out import CompletionChunks

    asked = tools.tool_request({"tools": TOOLS})
    chunks = CompletionChunks(True, "m", False, "x", asked)
    text = WRITTEN[0]
    pieces = [c for i in range(0, len(text), 4) for c in chunks.piece(text[i : i + 4], 0)]
    deltas = [c["choices"][0]["delta"] for c in pieces]
    assert "".join(d.get("content", "") for d in deltas) == "Let me look."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "weather"), (1, "noop")]
    rec = SimpleNamespace(results=[answer(text)], metrics=None, id="run1")
    end = chunks.end(rec)
    assert end[-1]["choices"][0]["finish_reason"] == "tool_calls" and end[-1]["run_id"] == "run1"
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in end)  # none sent twice


def test_responses_stream_keeps_text_and_calls_in_the_order_written():
    from taskrun.tasks.wire import responses_api as ra
    from taskrun.tasks.wire.openai_out import CompletionChunks
    from taskrun.tasks.wire.responses_out import ResponseBuilder

    req = ra.read_request({"model": "m", "input": "hi", "tools": [{"type": "function", "name": "noop"}]}, None)
    build = ResponseBuilder(req, "m")
    chunks = CompletionChunks(True, "m", True, "x", tools.tool_request({"tools": TOOLS}))
    text = WRITTEN[4]
    events = build.start()
    for i in range(0, len(text), 3):
        for chunk in chunks.piece(text[i : i + 3], 0):
            events += build.events(chunk)
    rec = SimpleNamespace(results=[answer(text)], metrics=None, id="run1")
    for chunk in chunks.end(rec):
        events += build.events(chunk)
    events += build.finish()
    final = events[-1]["response"]["output"]
    assert [o["type"] for o in final] == ["function_call", "message"]
    assert final[1]["content"][0]["text"] == "Done, and <tool_call> is a tag."
    added = [(e["output_index"], e["item"]["type"]) for e in events if e["type"] == "response.output_item.added"]
    assert added == [(0, "function_call"), (1, "message")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


# --------------------------------------------------------------------------- the real client


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "weather"}}], ids=["required", "named"]
)
def test_a_required_call_has_schema_valid_arguments(client, choice):
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=64, seed=0
    )
    choice0 = r.choices[0]
    assert choice0.finish_reason == "tool_calls"
    call = choice0.message.tool_calls[0]
    assert call.function.name in ("weather", "noop") and call.id.startswith("call_")
    params = WEATHER if call.function.name == "weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), params)
    if isinstance(choice, dict):
        assert call.function.name == "weather"


def test_a_two_step_tool_loop_streams_in_openais_shape(client):
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=64, seed=0
    )
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, seed=0, stream=True
    )
    reasons = [c.choices[0].finish_reason for c in stream if c.choices]
    assert reasons[-1] in ("stop", "length", "tool_calls")
    streamed = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=64, seed=0, stream=True
    )
    deltas = [c.choices[0] for c in streamed if c.choices]
    calls = [tc for d in deltas for tc in (d.delta.tool_calls or ())]
    assert deltas[-1].finish_reason == "tool_calls" and calls[0].function.name == call.function.name
    assert json.loads(calls[0].function.arguments) == json.loads(call.function.arguments)


def test_with_tools_the_text_streams_as_it_is_written(client):
    """`auto` and an answer in words: the text comes chunk by chunk, not at the end, and is the
    text of the same answer unstreamed."""
    ask = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**ask).choices[0]
    chunks = [c.choices[0] for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    content = [c.delta.content for c in chunks if c.delta.content]
    assert len(content) > 2 and chunks[-1].finish_reason == whole.finish_reason == "length"
    assert "".join(content) == whole.message.content.strip() and not whole.message.tool_calls
