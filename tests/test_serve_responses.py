"""/v1/responses, driven by the real `openai` client against `run serve` (the session's
tiny-model server, tests/serve_helpers.py), and the wire layer's reading of a Responses request
(tasks/wire/responses_api.py)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from taskrun.tasks.wire import responses_api as ra
from taskrun.tasks.wire.errors import APIError

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
TOOLS = [{"type": "function", "name": "weather", "description": "The forecast.", "parameters": WEATHER}]
MODEL = "slow-llama"  # an 8k window: the tools' signatures fit (tests/test_serve_tools.py)


@pytest.fixture
def client(servers):
    return openai.OpenAI(base_url=servers[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)


# --------------------------------------------------------------------------- the wire layer


def test_items_become_chat_messages_with_calls_and_outputs():
    store = ra.ResponseStore()
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    req = ra.read_request({"model": "m", "input": items, "instructions": "Be brief.", "tools": TOOLS}, store)
    assert req.chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert req.chat["tools"][0] == {"type": "function", "function": {k: TOOLS[0][k] for k in TOOLS[0] if k != "type"}}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"background": True}, "background"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
    ],
)
def test_what_taskrun_cannot_do_is_named(extra, param):
    with pytest.raises(APIError) as err:
        ra.read_request({"model": "m", "input": "hi", **extra}, ra.ResponseStore())
    assert err.value.param == param and err.value.status == 400


def test_the_store_keeps_the_newest():
    store = ra.ResponseStore(limit=2)
    for n in range(3):
        store.keep({"id": f"r{n}"}, [{"role": "user", "content": str(n)}])
    assert store.messages("r2") == [{"role": "user", "content": "2"}]
    with pytest.raises(APIError):
        store.messages("r0")


# --------------------------------------------------------------------------- the real client


def test_text_with_instructions_and_usage(client):
    r = client.responses.create(model=MODEL, instructions="Answer briefly.", input="Hello", max_output_tokens=6)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output_text == r.output[0].content[0].text
    assert r.usage.output_tokens <= 6 and r.usage.input_tokens > 0
    assert client.responses.retrieve(r.id).id == r.id


def test_a_stream_has_the_responses_events_and_matches_its_end(client):
    events = list(client.responses.create(model=MODEL, input="Hello", max_output_tokens=6, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # a 6-token limit cuts a random model short: OpenAI ends such a stream with response.incomplete
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_item.added" in kinds and "response.output_item.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and final.output_text == text and final.usage.output_tokens <= 6
    if kinds[-1] == "response.incomplete":
        assert final.incomplete_details.reason == "max_output_tokens"


def test_a_required_function_call_then_its_output_through_previous_response_id(client):
    first = client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=TOOLS, tool_choice="required", max_output_tokens=64
    )
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=TOOLS,
        max_output_tokens=6,
    )
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    streamed = client.responses.create(
        model=MODEL, input="Weather?", tools=TOOLS, tool_choice="required", max_output_tokens=64, stream=True
    )
    events = list(streamed)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].name == "weather"
    jsonschema.validate(json.loads(done[0].arguments), WEATHER)
    assert events[-1].response.output[-1].arguments == done[0].arguments


def test_a_json_schema_text_format_is_held(client):
    r = client.responses.create(
        model=MODEL,
        input="Weather?",
        text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}},
        max_output_tokens=64,
    )
    jsonschema.validate(json.loads(r.output_text), WEATHER)


def test_an_unknown_field_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0].type"
