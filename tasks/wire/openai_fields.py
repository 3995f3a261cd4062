"""The OpenAI endpoints' request surface: their paths, the sampling fields they read, and the
request schemas /openapi.json gives them, field by field as tasks/wire/openai_api.py's parsers read
them (fields.body_schema adds the neutral fields, at their neutral values only; the sampling ranges
are fields.SAMPLING_RANGES, the table the parsers check). openai_api.py re-exports the names.
Torch- and web-framework-free.
"""

from __future__ import annotations

from typing import Any

from taskrun.tasks.wire import fields, tools
from taskrun.tasks.wire.fields import (
    MAX_IMAGES,
    MAX_INPUTS,
    MAX_MESSAGES,
    PROMPT_SCHEMA,
    TEXT_SCHEMA,
    body_schema,
    nullable,
    sampling_schema,
)

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
TRANSCRIPTIONS, TRANSLATIONS, IMAGES = "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/generations"
SAMPLING = {"max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "top_k", "repeat_penalty"}

_MODEL = {"type": ["string", "null"], "description": "a model GET /v1/models lists (null: the task's default)"}
_PARTS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    },
}
_CONTENT = {"anyOf": [TEXT_SCHEMA, _PARTS, {"type": "null"}]}
_NAME = {"type": ["string", "null"]}
# by role: only an assistant message carries tool_calls, only a tool one answers a call (after the
# assistant message that made it); the last message is the user's (a schema cannot say "last")
MESSAGE_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"enum": ["system", "developer", "user"]},
                "content": {"anyOf": [TEXT_SCHEMA, _PARTS]},
                "name": _NAME,
            },
            "additionalProperties": False,
        },
        {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": {"const": "assistant"},
                "content": _CONTENT,
                "name": _NAME,
                "tool_calls": tools.TOOL_CALLS_SCHEMA,
            },
            "additionalProperties": False,
        },
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {"role": {"const": "tool"}, "content": _CONTENT, "tool_call_id": _NAME, "name": _NAME},
            "additionalProperties": False,
        },
    ]
}
_STREAM = {
    "stream": nullable("boolean"),
    "stream_options": {
        "type": ["object", "null"],
        "properties": {"include_usage": {"type": "boolean"}, "include_obfuscation": {"type": "boolean"}},
        "additionalProperties": False,
        "description": 'only with "stream": true',
    },
}
_SAMPLING = {
    **sampling_schema(SAMPLING),
    "max_completion_tokens": sampling_schema({"max_tokens"})["max_tokens"],
}
_TEXTS = {"anyOf": [PROMPT_SCHEMA, {"type": "array", "items": PROMPT_SCHEMA, "minItems": 1, "maxItems": MAX_INPUTS}]}
_AUDIO: dict[str, Any] = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "model": {"type": "string"},
        "response_format": {"enum": ["json", "text", "srt", "vtt", "verbose_json"]},
        "temperature": {"type": "number", "minimum": 0, "maximum": 0, "description": "beam search: 0 only"},
        "timestamp_granularities[]": {
            "type": "array",
            "items": {"enum": ["segment", "word"]},
            "description": "with response_format verbose_json",
        },
        "stream": {"type": "boolean", "enum": [False], "description": "transcripts are answered whole"},
        "language": {"type": "string", "description": "a language code such as en (transcriptions only)"},
    },
}
REQUEST_SCHEMAS: dict[str, dict] = {
    CHAT: body_schema(
        {
            "model": _MODEL,
            "messages": {"type": "array", "items": MESSAGE_SCHEMA, "minItems": 1, "maxItems": MAX_MESSAGES},
            **_STREAM,
            **_SAMPLING,
            "response_format": {
                "type": ["object", "null"],
                "required": ["type"],
                "properties": {
                    "type": {"enum": ["text", "json_object", "json_schema"]},
                    "json_schema": {"type": "object", "properties": {"schema": {"type": ["object", "boolean"]}}},
                },
            },
            "tools": tools.TOOLS_SCHEMA,
            "tool_choice": tools.TOOL_CHOICE_SCHEMA,
            "parallel_tool_calls": nullable("boolean"),
        },
        ("messages",),
    ),
    COMPLETIONS: body_schema({"model": _MODEL, "prompt": _TEXTS, **_STREAM, **_SAMPLING}, ("prompt",)),
    EMBEDDINGS: body_schema(
        {"model": _MODEL, "input": _TEXTS, "encoding_format": {"enum": ["float", "base64", None]}}, ("input",)
    ),
    TRANSCRIPTIONS: _AUDIO,
    TRANSLATIONS: {**_AUDIO, "properties": {k: v for k, v in _AUDIO["properties"].items() if k != "language"}},
    IMAGES: body_schema(
        {
            "model": _MODEL,
            "prompt": {**PROMPT_SCHEMA, "description": "none for an unconditional model such as digits-ddpm"},
            "n": nullable("integer", minimum=1, maximum=MAX_IMAGES),
            "size": nullable("string", description='WIDTHxHEIGHT such as 256x256, or "auto"'),
            "response_format": {"enum": ["b64_json", None], "description": "images are answered inline"},
            "seed": nullable("integer", minimum=0),
            "steps": nullable("integer", minimum=1, maximum=1000),
            "negative": nullable("string"),
            "guidance": nullable("number", minimum=0, maximum=50),
            "label": nullable("string", description="the class to draw (digits-ddpm: 0-9)"),
        }
    ),
}


def openapi_body(path: str) -> dict:
    """``openapi_extra`` for the route of ``path``: its body's schema (audio is a multipart form)."""
    media = "multipart/form-data" if path in (TRANSCRIPTIONS, TRANSLATIONS) else "application/json"
    return fields.openapi_body(REQUEST_SCHEMAS[path], media)
