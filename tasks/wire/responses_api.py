"""OpenAI's Responses API (``POST /v1/responses``) over the chat door: a request becomes a chat
completions body (tasks/wire/openai_api.py runs it), and the chat answer becomes a ``response``
object, or, streamed, the Responses event sequence (``response.created`` ...
``response.output_text.delta`` ... ``response.completed``).

``instructions`` is the system prompt; ``input`` a string or a list of items (messages,
``function_call`` and ``function_call_output``); ``tools`` are flat function tools; ``text.format``
is a JSON schema (or json_object); ``previous_response_id`` continues a conversation kept in
memory for the server's life (the newest MAX_KEPT responses). Torch- and web-framework-free.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from taskrun.tasks.wire import fields
from taskrun.tasks.wire.errors import APIError, invalid, unsupported
from taskrun.tasks.wire.fields import PROMPT_SCHEMA, sampling_schema
from taskrun.tasks.wire.tools import FUNCTION_SCHEMA, MAX_TOOLS

RESPONSES = "/v1/responses"
MAX_KEPT = 512  # responses kept for previous_response_id (each holds its conversation's messages)

FIELDS = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "text",
    "previous_response_id",
    "store",
    "metadata",
    "user",
    "seed",
}
# accepted at these values only (they would change nothing here)
NEUTRAL = {
    "include": (None, []),
    "truncation": (None, "disabled"),
    "reasoning": (None, {}, {"effort": None}, {"effort": None, "summary": None}),
    "background": (None, False),
    "service_tier": (None, "auto", "default"),
    "top_logprobs": (None, 0),
    "max_tool_calls": (None,),
    "prompt": (None,),
    "stream_options": (None, {}),
}
_PART_TYPES = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return prefix + "_" + uuid.uuid4().hex


class ResponseStore:
    """The newest responses' conversations, for ``previous_response_id`` (and GET by id)."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, tuple[list[dict], dict]] = OrderedDict()

    def keep(self, response: dict, messages: list[dict]) -> None:
        self._kept[response["id"]] = (messages, response)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def messages(self, response_id: str) -> list[dict]:
        kept = self._kept.get(response_id)
        if kept is None:
            raise APIError(
                400,
                f"no response '{response_id}' is kept on this server (it keeps the newest {self.limit} "
                "since it started); send the whole conversation in 'input' instead",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return list(kept[0])

    def get(self, response_id: str) -> dict:
        kept = self._kept.get(response_id)
        if kept is None:
            raise APIError(404, f"no response '{response_id}' is kept on this server", code="not_found")
        return kept[1]


@dataclass
class ResponsesRequest:
    body: dict  # the Responses request as sent
    chat: dict  # the chat completions body it runs as
    messages: list[dict]  # the conversation without the instructions (kept for previous_response_id)
    stream: bool
    keep: bool
    id: str = field(default_factory=lambda: new_id("resp"))


def read_request(body: dict, store: ResponseStore) -> ResponsesRequest:
    """The chat body for a Responses request; 400 naming the field for what taskrun cannot do."""
    for key, value in body.items():
        if key in NEUTRAL:
            if value not in NEUTRAL[key]:
                raise unsupported(key, "taskrun accepts only " + " or ".join(json.dumps(v) for v in NEUTRAL[key][1:]))
        elif key not in FIELDS:
            raise unsupported(key, f"/v1/responses takes: {', '.join(sorted(FIELDS))}")
    stream = body.get("stream")
    if stream not in (None, True, False):
        raise invalid("stream", "'stream' must be true or false")
    keep = body.get("store")
    if keep not in (None, True, False):
        raise invalid("store", "'store' must be true or false")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise invalid("previous_response_id", "'previous_response_id' must be a response id")
    messages = store.messages(previous) if previous else []
    messages += input_messages(body.get("input"))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": list(messages)}
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "'instructions' must be a string")
        if instructions:
            chat["messages"] = [{"role": "system", "content": instructions}, *messages]
    for key in ("temperature", "top_p", "seed", "parallel_tool_calls"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") not in (None, []):
        chat["tools"] = [_tool(t, i) for i, t in enumerate(_list(body["tools"], "tools"))]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if stream:
        chat["stream"] = True
    return ResponsesRequest(body, chat, messages, bool(stream), keep is not False)


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise invalid(where, f"'{where}' must be a list")
    return value


def _tool(tool: Any, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise unsupported(f"{where}.type", f"tool type {json.dumps(kind)}; taskrun calls function tools only")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice  # "auto" | "none" | "required"; anything else is refused by name in tools.py


def text_format(text: Any) -> dict | None:
    """``text.format`` → chat's response_format (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise invalid("text", "'text' must be {\"format\": {...}}")
    if text.get("verbosity") not in (None, "medium"):
        raise unsupported("text.verbosity", 'taskrun accepts only "medium"')
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), (dict, bool)):
            raise invalid("text.format.schema", "text.format.schema must be a JSON Schema object")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "answer", "schema": fmt["schema"]}}
    raise invalid("text.format", "text.format.type must be text, json_object or json_schema")


def input_messages(value: Any) -> list[dict]:
    """``input`` (a string or items) as chat messages: function calls join the assistant message
    before them, their outputs become ``tool`` messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    items = _list(value, "input")
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, f"{where} must be an object (a message or a function call)")
        kind = item.get("type") or "message"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"{where}.role", "a message's role is user, assistant, system or developer")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id") or new_id("call"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and "tool_calls" in prev:
                prev["tool_calls"].append(call)
            elif prev is not None and prev["role"] == "assistant":
                prev["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # a reasoning model's notes sent back: this server's models write none
        else:
            raise unsupported(
                f"{where}.type", f"input item {json.dumps(kind)}; taskrun reads messages and function calls"
            )
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") not in _PART_TYPES
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported(f"{where}[{j}]", f"content part {json.dumps(kind)}; only text parts are read")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid(where, f"{where} must be a string or a list of input_text parts")


# --------------------------------------------------------------------------- OpenAPI request body
# What read_request reads: /openapi.json's schema of POST /v1/responses.

_PARTS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"enum": list(_PART_TYPES)}, "text": {"type": "string"}},
    },
}
_CONTENT = {"anyOf": [{"type": "string"}, _PARTS]}
_ITEM = {
    "anyOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "type": {"const": "message"},
                "role": {"enum": ["user", "assistant", "system", "developer"]},
                "content": _CONTENT,
            },
        },
        {
            "type": "object",
            "required": ["type", "name"],
            "properties": {
                "type": {"const": "function_call"},
                "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"type": "string", "description": "the arguments as JSON text"},
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": {"type": "string"},
                "output": _CONTENT,
            },
        },
        {"type": "object", "required": ["type"], "properties": {"type": {"const": "reasoning"}}},
    ]
}
_FORMAT = {
    "type": ["object", "null"],
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "name": {"type": "string"},
        "schema": {"type": ["object", "boolean"], "description": "with json_schema: the JSON Schema"},
    },
}
REQUEST_SCHEMA = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": {"type": ["string", "null"]},
        "input": {
            "anyOf": [PROMPT_SCHEMA, {"type": "array", "items": _ITEM, "minItems": 1}],
            "description": "a text, or items (with previous_response_id, they continue that conversation)",
        },
        "instructions": {"type": ["string", "null"], "description": "the system prompt"},
        **sampling_schema({"temperature", "top_p", "seed"}),
        "max_output_tokens": sampling_schema({"max_tokens"})["max_tokens"],
        "tools": {
            "type": ["array", "null"],
            "maxItems": MAX_TOOLS,
            "items": {
                **FUNCTION_SCHEMA,
                "required": ["type", "name"],
                "properties": {"type": {"const": "function"}, **FUNCTION_SCHEMA["properties"]},
            },
        },
        "tool_choice": {
            "anyOf": [
                {"enum": ["auto", "none", "required", None]},
                {
                    "type": "object",
                    "required": ["type", "name"],
                    "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
                },
            ]
        },
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "stream": {"type": ["boolean", "null"]},
        "store": {"type": ["boolean", "null"], "description": "false: not kept for previous_response_id"},
        "text": {
            "type": ["object", "null"],
            "properties": {"format": _FORMAT, "verbosity": {"enum": ["medium", None]}},
            "additionalProperties": False,
        },
        "previous_response_id": {"type": ["string", "null"]},
        "metadata": {"description": "accepted and not read"},
        "user": {"description": "accepted and not read"},
        **{k: {"enum": list(v), "description": "no effect in taskrun"} for k, v in NEUTRAL.items()},
    },
    "additionalProperties": False,
}


def openapi_body(path: str = RESPONSES) -> dict:
    """``openapi_extra`` for POST /v1/responses."""
    return fields.openapi_body(REQUEST_SCHEMA)
