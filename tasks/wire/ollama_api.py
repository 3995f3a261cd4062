"""Ollama request bodies → taskrun jobs, and finished jobs → Ollama's answers.

Shapes as the official ``ollama`` Python client sends and parses them: ``options`` holds the
sampling settings (temperature, top_p, top_k, seed, num_predict, stop, repeat_penalty; any
other is a 400 naming it), ``format`` is "json" or a JSON Schema, durations are nanoseconds.
``keep_alive`` 0 unloads the model once the request is done; other values are checked and keep
it loaded until the memory budget needs the room. Errors on /api/* are answered in Ollama's ``{"error": "..."}`` shape (runner/serve/app.py).
Neutral values (null, ``[]``, ``{}``) are accepted as absent, as Ollama does; ``name:latest`` is
``name``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from taskrun.tasks.wire import fields
from taskrun.tasks.wire import tools as tool_calls
from taskrun.tasks.wire.errors import invalid, unsupported
from taskrun.tasks.wire.fields import MAX_INPUTS, MAX_TEXT_CHARS, check_fields, model_of, text_of, typed
from taskrun.tasks.wire.jobspec import JobSpec, Uploads
from taskrun.tasks.wire.ollama_info import details
from taskrun.tasks.wire.openai_api import chat_messages
from taskrun.tasks.wire.openai_out import finish_reason

# Ollama option → generate option
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "num_predict": "max_tokens",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "num_ctx": "context",  # this request's window, at most the model's (generate's --context)
}
UNLIMITED = 1_000_000  # num_predict -1: until the answer ends or the window is full
NS = 1_000_000_000


_DURATION = re.compile(r"^-?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive(body: dict) -> float | None:
    """``keep_alive`` in seconds as Ollama reads it: a number of seconds or a Go duration ("5m",
    "1h30m", "-1"); 0 unloads the model after the request, a negative value keeps it loaded
    (taskrun keeps models loaded until the memory budget needs the room either way). None: absent."""
    value = body.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise invalid("keep_alive", "'keep_alive' must be a number of seconds or a duration such as \"5m\"")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if not _DURATION.match(text):
        raise invalid(
            "keep_alive", f'keep_alive {json.dumps(value)} is not a duration: give seconds or e.g. "5m", "1h", "-1"'
        )
    sign = -1.0 if text.startswith("-") else 1.0
    total = sum(float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)", text))
    return sign * total


def load_only(body: dict, chat: bool) -> bool:
    """Ollama's load/unload idiom: a generate with no prompt, a chat with no messages (checked
    as the request would be: a bad keep_alive is still a 400)."""
    body = neutral(body)
    keep_alive(body)
    if chat:
        return "messages" not in body
    return body.get("prompt") in (None, "") and not body.get("raw")


def ollama_model(body: dict) -> str | None:
    """The model named, with Ollama's default tag ``:latest`` taken off (taskrun's names have none)."""
    name = model_of(body)
    return name.removesuffix(":latest") if name else name


def neutral(body: dict) -> dict:
    """The body without the fields set to a value that means "absent" (null, [], {})."""
    return {k: v for k, v in body.items() if v is not None and v != [] and v != {}}


def sampling(body: dict) -> dict:
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise invalid("options", "'options' must be an object")
    out: dict[str, Any] = {}
    for key, value in neutral(opts).items():
        if key not in OPTIONS:
            raise unsupported(f"options.{key}", f"taskrun reads {', '.join(OPTIONS)}")
        if value is not None:
            out[OPTIONS[key]] = value
    names = {v: k for k, v in OPTIONS.items()}
    out = {
        **out,
        **fields.sampling({k: v for k, v in out.items() if k in names}, "options.", fewest_tokens=-2, names=names),
    }
    if out.get("max_tokens") in (-1, -2):
        out["max_tokens"] = UNLIMITED
    return out


def format_options(body: dict, uploads: Uploads) -> dict:
    """``format``: "json" (any JSON object) or a JSON Schema → generate's json_schema, written
    to the request's own folder."""
    fmt = body.get("format")
    if fmt in (None, ""):
        return {}
    if fmt == "json":
        schema: Any = {"type": "object"}
    elif isinstance(fmt, dict):
        schema = fmt
    else:
        raise invalid("format", "'format' must be \"json\" or a JSON Schema object")
    path = uploads.dir / "format-schema.json"
    path.write_text(json.dumps(schema), encoding="utf-8")
    return {"json_schema": str(path)}


NEUTRAL_GEN = {"keep_alive", "stream", "model", "options", "format", "think"}


def _no_thinking(body: dict) -> None:
    if body.get("think") not in (None, False):
        raise unsupported("think", "taskrun's models do not think separately")


def generate_spec(body: dict, uploads: Uploads) -> JobSpec:
    """/api/generate: a prompt, with the chat template unless ``raw``."""
    body = neutral(body)
    check_fields(body, NEUTRAL_GEN | {"prompt", "system", "raw", "images", "suffix", "template", "context"})
    keep_alive(body)
    _no_thinking(body)
    for key in ("images", "context"):
        if body.get(key):
            raise unsupported(
                key,
                "taskrun's language models read text only"
                if key == "images"
                else "send the conversation to /api/chat instead",
            )
    if body.get("suffix") or body.get("template"):
        raise unsupported("suffix" if body.get("suffix") else "template")
    options = {**sampling(body), **format_options(body, uploads), "stream": True}
    system = typed(body, "system", str, "a string")
    if system and len(system) > MAX_TEXT_CHARS:
        raise invalid("system", f"'system' is {len(system):,} characters; the limit is {MAX_TEXT_CHARS:,}")
    if system:
        options["system"] = system
    if typed(body, "raw", bool, "true or false"):
        options["raw"] = True
    return JobSpec("generate", [text_of(body.get("prompt"), "prompt")], options, model=ollama_model(body))


def chat_spec(body: dict, uploads: Uploads) -> JobSpec:
    """/api/chat: messages → system, history and the last user message."""
    body = neutral(body)
    if isinstance(body.get("messages"), list):
        body["messages"] = [neutral(m) if isinstance(m, dict) else m for m in body["messages"]]
    check_fields(body, NEUTRAL_GEN | {"messages", "tools"})
    keep_alive(body)
    _no_thinking(body)
    asked = chat_tools(body)
    system, history, prompt = chat_messages(tool_calls.plain_messages(body.get("messages")))
    options = {**sampling(body), **format_options(body, uploads), "stream": True}
    if asked is not None:
        system = asked.system(system)
    if system:
        options["system"] = system
    if history:
        options["history"] = history
    return JobSpec("generate", [prompt], options, model=ollama_model(body))


def chat_tools(body: dict) -> tool_calls.ToolRequest | None:
    """/api/chat's ``tools`` (OpenAI's function shape; Ollama has no tool_choice: the model chooses)."""
    tools = body.get("tools")
    return tool_calls.tool_request({"tools": tools}) if tools else None


def ollama_calls(asked: tool_calls.ToolRequest, result) -> tuple[str, list[dict]]:
    """(the text left, the calls in Ollama's shape: arguments as an object, no ids)."""
    content, calls = asked.calls(result)
    return content or "", [ollama_call(c) for c in calls]


def ollama_call(call: dict) -> dict:
    """An OpenAI tool call in Ollama's shape."""
    return {"function": {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])}}


def stream_lines(model: str, parts) -> list[dict]:
    """Streamed /api/chat lines for a ToolStream's parts: text as content, each call as soon as it
    is complete in a line of its own (as Ollama streams them)."""
    out = []
    for kind, value in parts:
        line = text_line(True, model, value if kind == "text" else "")
        if kind == "call":
            line["message"]["tool_calls"] = [ollama_call(value)]
        out.append(line)
    return out


def embed_spec(body: dict) -> JobSpec:
    body = neutral(body)
    if "prompt" in body and "input" not in body:  # the legacy /api/embeddings: one text as prompt
        body["input"] = body.pop("prompt")
    if isinstance(body.get("options"), dict):
        body["options"] = neutral(body["options"])
    check_fields(body, {"model", "input", "truncate", "options", "keep_alive", "dimensions"})
    keep_alive(body)
    if body.get("options"):
        raise unsupported("options", "embeddings take no options here")
    if body.get("dimensions") is not None:
        raise unsupported("dimensions", "vectors have the model's own length")
    value = body.get("input")
    texts = value if isinstance(value, list) else [value]
    if not texts or len(texts) > MAX_INPUTS:
        raise invalid("input", f"'input' must be a text or a list of 1 to {MAX_INPUTS} texts (got {len(texts):,})")
    inputs = [text_of(t, "input" if len(texts) == 1 else f"input[{i}]") for i, t in enumerate(texts)]
    return JobSpec("embed", inputs, {}, model=ollama_model(body))


# --------------------------------------------------------------------------- answers


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def durations(rec, total_s: float) -> dict:
    """Ollama's timing fields in nanoseconds. eval_duration is first token → last (wall − ttft).

    The prompt counts as Ollama documents them (docs.ollama.com/api/usage):
    prompt_eval_count is the whole prompt, prompt_eval_cached_count those of its tokens read
    from the prompt cache (generate's cached_prompt_tokens), prompt_eval_duration the time
    spent on the rest. A prompt identical to the last one read counts as cached whole: its
    logits are replayed, where Ollama reads the last token again and counts it as evaluated."""
    m = rec.metrics
    out = {"total_duration": int(total_s * NS), "load_duration": int(rec.load_s * NS)}
    if m is not None and hasattr(m, "prefill_s"):
        out.update(
            prompt_eval_count=m.input_tokens,
            prompt_eval_cached_count=int(getattr(m, "cached_prompt_tokens", 0) or 0),
            prompt_eval_duration=int(m.prefill_s * NS),
            eval_count=m.output_tokens,
            eval_duration=int(max(0.0, rec.wall_s - m.ttft_s) * NS),
        )
    elif m is not None and hasattr(m, "input_tokens"):
        out["prompt_eval_count"] = sum(r.tokens for r in rec.results)
    return out


def text_line(chat: bool, model: str, piece: str) -> dict:
    content = {"message": {"role": "assistant", "content": piece}} if chat else {"response": piece}
    return {"model": model, "created_at": now(), **content, "done": False}


def final_line(chat: bool, model: str, rec, total_s: float, text: str = "", asked=None) -> dict:
    """The last object: done, why, the timings (and the whole answer when not streamed; with
    tools asked for, the answer is held back to this line, its calls as ``tool_calls``)."""
    result = rec.results[0] if rec.results else None
    reason = finish_reason(result.finish_reason) if result is not None else "stop"
    line = text_line(chat, model, text)
    if asked is not None and result is not None:
        content, calls = ollama_calls(asked, result)
        line["message"]["content"] = content
        if calls:
            line["message"]["tool_calls"] = calls
    return {**line, "done": True, "done_reason": reason, **durations(rec, total_s), "run_id": rec.id}


def embed_body(model: str, rec, total_s: float) -> dict:
    return {"model": model, "embeddings": [list(map(float, r.vector)) for r in rec.results], **durations(rec, total_s)}


def tags_body(rows: list[dict]) -> dict:
    models = []
    for r in rows:
        modified = datetime.fromtimestamp(r.get("created", 0), timezone.utc).isoformat().replace("+00:00", "Z")
        models.append(
            {
                "name": r["name"],
                "model": r["name"],
                "modified_at": modified,
                "size": r["size_bytes"],
                "digest": r["digest"].removeprefix("sha256:"),
                "details": {**details(r), "tasks": r["tasks"]},
            }
        )
    return {"models": models}


# --------------------------------------------------------------------------- OpenAPI request bodies
# The routes read raw bodies (neutral values are accepted that a strict model would refuse), so
# their request schemas are declared here for /openapi.json; extra fields stay allowed, as in Ollama.
_OPTIONS = {
    "type": ["object", "null"],
    "properties": fields.sampling_schema(
        set(OPTIONS.values()), fewest_tokens=-2, names={v: k for k, v in OPTIONS.items()}
    ),
    # any other option only at a neutral value (langchain sends every option, unset ones as null)
    "additionalProperties": {"enum": [None, [], {}]},
}
_KEEP_ALIVE = {
    "type": ["string", "number", "null"],
    "description": 'a duration such as "5m", seconds, 0 to unload, negative to keep',
}
_COMMON = {
    "model": {"type": "string"},
    "stream": {"type": "boolean", "default": True},
    "format": {"description": '"json" or a JSON schema'},
    "options": _OPTIONS,
    "keep_alive": _KEEP_ALIVE,
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"type": "string"},
        "images": {"type": "array", "items": {"type": "string"}},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
    },
}
_TEXTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
_NAMED: dict[str, Any] = {
    "type": "object",
    "properties": {"model": {"type": "string"}, "name": {"type": "string", "description": "older clients' model"}},
}
REQUEST_SCHEMAS = {
    "/api/generate": {
        "type": "object",
        "required": ["model"],
        "properties": {
            **_COMMON,
            "prompt": {"type": "string"},
            "system": {"type": "string"},
            "raw": {"type": "boolean"},
        },
    },
    "/api/chat": {
        "type": "object",
        "required": ["model"],
        "properties": {
            **_COMMON,
            "messages": {"type": "array", "items": _MESSAGE},
            "tools": {"type": "array", "items": {"type": "object"}},
        },
    },
    "/api/embed": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string"},
            "input": _TEXTS,
            "truncate": {"type": "boolean", "default": True},
            "options": _OPTIONS,
            "keep_alive": _KEEP_ALIVE,
        },
    },
    "/api/embeddings": {  # the legacy one: one text as prompt
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": {"type": "string"},
            "prompt": {"type": "string"},
            "options": _OPTIONS,
            "keep_alive": _KEEP_ALIVE,
        },
    },
    "/api/show": {**_NAMED, "properties": {**_NAMED["properties"], "verbose": {"type": "boolean"}}},
    "/api/pull": {**_NAMED, "description": "always refused: this server does not download models"},
    "/api/delete": {**_NAMED, "description": "always refused: this server does not delete models"},
}


def openapi_body(path: str) -> dict:
    """``openapi_extra`` for a route that reads its JSON body itself."""
    return fields.openapi_body(REQUEST_SCHEMAS[path])
