"""The request-field layer every OpenAI and Ollama parser shares: the size limits, the fields that
are accepted only at their neutral value, and the typed reads that answer a bad field with a 400
naming it and the form it takes.
"""

from __future__ import annotations

import json
from typing import Any

from taskrun.tasks.base import Input, TaskError
from taskrun.tasks.generate import REPEAT_PENALTY
from taskrun.tasks.inputs import text_input
from taskrun.tasks.wire.errors import APIError, invalid, unsupported

MAX_TEXT_CHARS = 200_000  # one prompt, message or text: ~50k tokens, past any window taskrun runs
MAX_INPUTS = 2048  # texts in one embeddings request (OpenAI's own limit)
MAX_MESSAGES = 1000
MAX_IMAGES = 10  # images per request (OpenAI's n limit)

# Fields with no effect in taskrun, accepted at these values only.
NEUTRAL: dict[str, tuple] = {
    "n": (1,),
    "logprobs": (False, None),
    "top_logprobs": (None, 0),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None,),
    "store": (None, False),
    "metadata": (None, {}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "service_tier": (None, "auto", "default"),
    "web_search_options": (None,),
    "echo": (False, None),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "dimensions": (None,),
    "quality": (None, "auto", "standard"),
    "style": (None,),
    "background": (None, "auto"),
    "moderation": (None, "auto"),
    "output_format": (None, "png"),
    "prompt": (None, ""),
}
TOLERATED = {"user"}
# Why a neutral field cannot take another value, where "only X" does not say it.
WHY_NOT = {
    "n": "one answer per request: send several requests, or several prompts to /v1/completions",
    "tools": "taskrun does not call tools",
    "functions": "taskrun does not call tools",
    "tool_choice": "taskrun does not call tools",
    "function_call": "taskrun does not call tools",
    "logprobs": "log-probabilities are not reported",
    "top_logprobs": "log-probabilities are not reported",
    "presence_penalty": "use repeat_penalty (taskrun's, as in llama.cpp) instead",
    "frequency_penalty": "use repeat_penalty (taskrun's, as in llama.cpp) instead",
    "dimensions": "vectors have the model's own length",
}


def check_fields(body: dict, known: set[str]) -> None:
    """Refuse a field this endpoint does not know, or a neutral one set to a value with an effect."""
    for key, value in body.items():
        if key in NEUTRAL and key not in known:
            if value not in NEUTRAL[key]:
                raise unsupported(key, WHY_NOT.get(key) or f"taskrun accepts only {_shown(NEUTRAL[key])} here")
        elif key not in known and key not in TOLERATED:
            raise unsupported(key, f"this endpoint takes: {', '.join(sorted(known | TOLERATED))}")


def _shown(values: tuple) -> str:
    return " or ".join(json.dumps(v) for v in values if v is not None) or "nothing (leave it out)"


def typed(body: dict, key: str, kind: type | tuple, what: str) -> Any:
    """``body[key]`` when it is of ``kind`` (None when absent); a 400 naming the field otherwise.
    Form fields (multipart) arrive as strings and are converted."""
    value = body.get(key)
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, str) and str not in kinds:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise invalid(key, f"'{key}' must be {what} (got {json.dumps(value)[:40]})")
    return value


def model_of(body: dict) -> str | None:
    """The model named by the request (None: the task's default)."""
    return typed(body, "model", str, "a model name (see GET /v1/models)") or None


def text_of(value: Any, field: str) -> Input:
    if not isinstance(value, str):
        raise invalid(field, f"'{field}' must be a string")
    if len(value) > MAX_TEXT_CHARS:
        raise invalid(field, f"'{field}' is {len(value):,} characters; the limit is {MAX_TEXT_CHARS:,}")
    try:
        return text_input(value, field)
    except TaskError as exc:
        raise invalid(field, str(exc)) from None


# --------------------------------------------------------------------------- the body itself

MAX_DEPTH = 32  # nesting of a request body: OpenAI's deepest (a JSON Schema in response_format) is far less
MAX_INT = 2**63 - 1  # any whole number in a body: past it no field has a meaning (seed, max_tokens)
JSON_TYPES = ("application/json",)


def json_content_type(content_type: str | None) -> None:
    """A JSON body must say so: a browser page may POST ``text/plain`` (a CORS-"simple" request
    that needs no preflight) or a form, and taking those as JSON lets any page run jobs."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind and kind not in JSON_TYPES and not kind.endswith("+json"):
        raise APIError(
            415,
            f"the request body is sent as {kind}; send it as JSON with the header Content-Type: application/json",
            code="unsupported_media_type",
            param="Content-Type",
        )


def read_json(raw: bytes, content_type: str | None = None) -> dict:
    """The request body as a JSON object, checked before any field is read: a JSON content type,
    valid UTF-8 JSON, an object, nested at most MAX_DEPTH deep, whole numbers within 64 bits and
    no lone surrogate in any string. Each refusal is a 4xx naming where the problem is."""
    json_content_type(content_type)
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    except RecursionError:
        raise invalid("body", f"the request body is nested too deep; the limit is {MAX_DEPTH} levels") from None
    except ValueError as exc:  # a number past Python's 4,300-digit limit
        raise invalid("body", f"the request body holds a number too long to read ({exc})"[:200]) from None
    if not isinstance(body, dict):
        raise invalid("body", "the request body must be a JSON object")
    check_values(body)
    return body


def check_values(body: Any) -> None:
    """Walk ``body`` without recursion (a deep one cannot crash the walk itself)."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise invalid(where or "body", f"the request body is nested too deep; the limit is {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for k, v in value.items():
                _check_str(k, where or "body")
                stack.append((v, f"{where}.{k}" if where else k, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
        elif isinstance(value, str):
            _check_str(value, where)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise invalid(where, f"'{where}' is out of range: whole numbers here lie within ±{MAX_INT:,}")


def _check_str(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(
            where, f"'{where}' holds a lone surrogate (\\ud800-\\udfff): send valid Unicode text (UTF-8)"
        ) from None


def number(
    body: dict, key: str, kind: type | tuple, what: str, low: float, high: float, field: str = "", above: bool = False
) -> Any:
    """``typed`` within [low, high] (``above``: (low, high]): a 400 naming the field, its form and
    its range otherwise."""
    name = field or key
    value = typed(body, key, kind, what) if not field else _typed_as(body, key, kind, what, field)
    if value is not None and ((value <= low if above else value < low) or value > high):
        span = f"above {_num(low)} and at most {_num(high)}" if above else f"from {_num(low)} to {_num(high)}"
        raise invalid(name, f"'{name}' must be {what} {span} (got {_num(value)})")
    return value


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _typed_as(body: dict, key: str, kind: type | tuple, what: str, field: str) -> Any:
    try:
        return typed(body, key, kind, what)
    except APIError:
        raise invalid(field, f"'{field}' must be {what} (got {json.dumps(body.get(key))[:40]})") from None


# (field, its type, its form in words, lowest, highest, whether the lowest itself is refused): what
# ``sampling`` reads, as generate's Options check it (tasks/generate.py), and /openapi.json says
SAMPLING_RANGES: tuple[tuple[str, Any, str, float, float, bool], ...] = (
    ("max_tokens", int, "a whole number of tokens", 1, 10_000_000, False),  # Ollama's num_predict goes lower
    ("temperature", (int, float), "a number", 0, 100, False),
    ("top_p", (int, float), "a number", 0, 1, True),
    ("seed", int, "a whole number", 0, 2**32 - 1, False),
    ("top_k", int, "a whole number", 0, 1_000_000, False),
    ("repeat_penalty", (int, float), "a number", *REPEAT_PENALTY, False),
    ("context", int, "a whole number of tokens", 1, 10_000_000, False),  # Ollama's num_ctx
)


def sampling(values: dict, prefix: str = "", fewest_tokens: int = 1, names: dict | None = None) -> dict:
    """generate's options from sampling fields (OpenAI's names; Ollama's options map onto them):
    each of its type and range, ``stop`` a string or a list of up to 16."""
    out: dict[str, Any] = {}
    name = {k: prefix + (names or {}).get(k, k) for k in values}
    for key, kind, what, low, high, above in SAMPLING_RANGES:
        low = fewest_tokens if key == "max_tokens" else low
        value = number(values, key, kind, what, low, high, name.get(key, key), above)
        if value is not None:
            out[key] = value
    stop = values.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
            field = name.get("stop", "stop")
            raise invalid(field, f"'{field}' must be a non-empty string or a list of up to 16 of them")
        out["stop"] = stops
    return out


# --------------------------------------------------------------------------- OpenAPI request bodies
# The routes read raw bodies (neutral values are accepted that a strict model would refuse), so each
# parser declares its body's schema for /openapi.json beside the code that reads it, from the same
# tables where there is one (SAMPLING_RANGES, NEUTRAL).

STOP_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 16},
        {"type": "null"},
    ]
}


def openapi_body(schema: dict, media: str = "application/json") -> dict:
    """``openapi_extra`` for a route that reads its body itself: the body's schema in /openapi.json."""
    return {"requestBody": {"required": True, "content": {media: {"schema": schema}}}}


def nullable(kind: str, **more: Any) -> dict:
    """A field ``typed`` reads: ``kind`` or null (absent)."""
    return {"type": [kind, "null"], **more}


def sampling_schema(keys: set[str], fewest_tokens: int = 1, names: dict | None = None) -> dict:
    """The properties ``sampling`` reads among ``keys`` (under the wire names ``names`` gives them)."""
    out: dict[str, Any] = {}
    for key, kind, what, low, high, above in SAMPLING_RANGES:
        if key in keys:
            low = fewest_tokens if key == "max_tokens" else low
            bound = {"exclusiveMinimum": low} if above else {"minimum": low}
            out[(names or {}).get(key, key)] = nullable(
                "integer" if kind is int else "number", **bound, maximum=high, description=what
            )
    if "stop" in keys:
        out[(names or {}).get("stop", "stop")] = STOP_SCHEMA
    return out


def body_schema(properties: dict, required: tuple[str, ...] = (), neutral: bool = True) -> dict:
    """A body ``check_fields`` reads: ``properties``, the neutral fields at their neutral values
    only, ``user``, and no other field (a 400 names it)."""
    props = dict(properties)
    if neutral:
        for key, values in NEUTRAL.items():
            if key not in props:
                props[key] = {"enum": list(values), "description": WHY_NOT.get(key, "no effect in taskrun")}
        props.update({k: {"description": "accepted and not read"} for k in TOLERATED})
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    return {**schema, "required": list(required)} if required else schema


TEXT_SCHEMA = {"type": "string", "maxLength": MAX_TEXT_CHARS}
PROMPT_SCHEMA = {**TEXT_SCHEMA, "pattern": r"\S", "description": "a text that is not blank"}  # text_of's rule
