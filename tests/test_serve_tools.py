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
    return SimpleNamespace(text=text, json=json_value, finish_reason="stop")


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
