"""OpenAI request bodies → taskrun jobs, and finished jobs → OpenAI response bodies.

Shared by the server's ``/v1/...`` endpoints and by ``run batch`` (OpenAI batch-file lines), so
one parser decides what each OpenAI field means. Torch- and web-framework-free.

Every field a request may carry is listed per endpoint (the neutral ones in tasks/wire/fields.py): a field taskrun implements maps
to a task option; a field with no effect here is accepted only at its neutral value (``n: 1``,
``logprobs: false``, ...); anything else is a 400 that names the field. Nothing is silently
ignored, except ``user`` (an end-user id that OpenAI itself only records).

Where taskrun's default differs from OpenAI's it is taskrun's, so a request gives the same
answer as the CLI: ``temperature`` defaults to 0 (greedy), ``max_tokens`` to generate's 256.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from taskrun.tasks.base import Input, TaskError
from taskrun.tasks.inputs import file_input
from taskrun.tasks.wire import openai_out, tools
from taskrun.tasks.wire.errors import APIError, from_task_error, invalid, unsupported
from taskrun.tasks.wire.fields import (
    MAX_IMAGES,
    MAX_INPUTS,
    MAX_MESSAGES,
    MAX_TEXT_CHARS,
    check_fields,
    model_of,
    sampling,
    text_of,
    typed,
)
from taskrun.tasks.wire.jobspec import JobSpec, Uploads
from taskrun.tasks.wire.openai_fields import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    IMAGES,
    SAMPLING,
    TRANSCRIPTIONS,
    TRANSLATIONS,
    openapi_body,
)

TASK_OF = {
    CHAT: "generate",
    COMPLETIONS: "generate",
    EMBEDDINGS: "embed",
    TRANSCRIPTIONS: "transcribe",
    TRANSLATIONS: "transcribe",
    IMAGES: "image",
}

TOOL_FIELDS = {"tools", "tool_choice", "parallel_tool_calls"}


def job_from_openai(path: str, body: dict, *, uploads: Uploads | None, allow_paths: bool = False) -> JobSpec:
    """The job for an OpenAI request to ``path`` (e.g. "/v1/chat/completions").

    For audio, ``body["file"]`` is the upload's bytes or ``(filename, bytes)``; with
    ``allow_paths`` (``run batch`` on the operator's own files) it may be a path string.
    ``uploads`` holds uploaded bytes and files the server writes for the job (a JSON schema, the
    images' folder); endpoints that need one refuse without it. Raises APIError (400 naming the
    field, or 404 for an unknown endpoint)."""
    parse = _PARSERS.get(path)
    if parse is None:
        raise APIError(404, f"no OpenAI endpoint {path}; this server has: {', '.join(_PARSERS)}", code="not_found")
    if not isinstance(body, dict):
        raise invalid("body", "the request body must be a JSON object")
    try:
        return parse(path, body, uploads, allow_paths)
    except TaskError as exc:
        raise from_task_error(exc) from None


# --------------------------------------------------------------------------- text generation


def sampling_options(body: dict) -> dict:
    """generate options from OpenAI's sampling fields."""
    out: dict[str, Any] = {}
    limit = [typed(body, k, int, "a whole number of tokens") for k in ("max_completion_tokens", "max_tokens")]
    if limit[0] is not None and limit[1] is not None and limit[0] != limit[1]:
        raise invalid("max_completion_tokens", "max_tokens and max_completion_tokens differ; give one")
    if limit[0] is not None or limit[1] is not None:
        out["max_tokens"] = limit[0] if limit[0] is not None else limit[1]
    rest = {k: body[k] for k in SAMPLING - {"max_tokens", "max_completion_tokens"} if k in body}
    return sampling({**rest, **out})


def response_format_options(body: dict, uploads: Uploads | None) -> dict:
    """``response_format`` → generate's json_schema option: the schema is written to the
    request's own folder (a client never names a path on the server)."""
    rf = body.get("response_format")
    if rf is None:
        return {}
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise invalid("response_format", "response_format.json_schema.schema must be a JSON Schema object")
    else:
        raise invalid(
            "response_format",
            '\'response_format\' must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", ...}',
        )
    if uploads is None:
        raise unsupported("response_format", "JSON output needs a folder for the schema here")
    path = uploads.dir / "response-schema.json"
    path.write_text(json.dumps(schema), encoding="utf-8")
    return {"json_schema": str(path)}


def tool_schema_options(asked: tools.ToolRequest, options: dict, uploads: Uploads | None) -> dict:
    """With tool_choice required or named, the call is decoded under its functions' schema."""
    schema = asked.schema()
    if schema is None:
        return {}
    if "json_schema" in options:
        raise unsupported(
            "response_format", "a JSON response_format and a required tool_choice both set the answer's form"
        )
    if uploads is None:
        raise unsupported("tool_choice", "a required tool call needs a folder for its schema here")
    path = uploads.dir / "tool-schema.json"
    path.write_text(json.dumps(schema), encoding="utf-8")
    return {"json_schema": str(path)}


def chat_messages(messages: Any) -> tuple[str, list[list[str]], Input]:
    """(system prompt, earlier turns as [role, text] pairs, the last user message as the prompt)."""
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", '\'messages\' must be a non-empty list of {"role", "content"}')
    if len(messages) > MAX_MESSAGES:
        raise invalid("messages", f"{len(messages)} messages; the limit is {MAX_MESSAGES}")
    system, turns = [], []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(where, f"{where} must be an object with role and content")
        extra = sorted(k for k, v in m.items() if k not in ("role", "content", "name") and v is not None)
        if extra:
            raise unsupported(f"{where}.{extra[0]}", "messages carry role and content only")
        role, text = m.get("role"), _content(m.get("content"), f"{where}.content")
        if role in ("system", "developer"):
            system.append(text)
        elif role in ("user", "assistant"):
            turns.append([role, text])
        else:
            raise unsupported(
                f"{where}.role",
                f"role {json.dumps(role)}: taskrun takes system, developer, user, assistant and tool messages (a tool one after the assistant message with its tool_calls)",
            )
    if not turns or turns[-1][0] != "user":
        raise invalid("messages", "the last message (after any system ones) must be the user's")
    prompt = text_of(turns[-1][1], f"messages[{len(messages) - 1}].content")
    return "\n\n".join(system), turns[:-1], prompt


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts (other parts are refused)."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported(where, f"content part of type {json.dumps(kind)}; only text parts are read")
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise invalid(where, f"{where} must be a string or a list of text parts")
    if len(text) > MAX_TEXT_CHARS:
        raise invalid(where, f"{where} is {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}")
    return text


def _stream_flag(body: dict) -> bool:
    stream = bool(typed(body, "stream", bool, "true or false"))
    if body.get("stream_options") is not None:
        opts = body["stream_options"]
        if not stream:
            raise invalid("stream_options", "'stream_options' is only allowed with \"stream\": true")
        if not isinstance(opts, dict) or set(opts) - {"include_usage", "include_obfuscation"}:
            raise unsupported("stream_options", "taskrun reads include_usage only")
    return stream


def _chat(path: str, body: dict, uploads: Uploads | None, allow_paths: bool) -> JobSpec:
    check_fields(body, {"model", "messages", "stream", "stream_options", "response_format"} | SAMPLING | TOOL_FIELDS)
    asked = tools.tool_request(body)
    system, history, prompt = chat_messages(tools.plain_messages(body.get("messages")))
    options = {**sampling_options(body), **response_format_options(body, uploads), "stream": _stream_flag(body)}
    if asked is not None:
        system = asked.system(system)
        options.update(tool_schema_options(asked, options, uploads))
    if system:
        options["system"] = system
    if history:
        options["history"] = history
    return JobSpec("generate", [prompt], options, model=model_of(body))


def _completions(path: str, body: dict, uploads: Uploads | None, allow_paths: bool) -> JobSpec:
    """A completion continues the prompt as written: no chat template (generate's raw)."""
    check_fields(body, {"model", "prompt", "stream", "stream_options"} | SAMPLING)
    prompt = body.get("prompt")
    prompts = prompt if isinstance(prompt, list) else [prompt]
    if not prompts or len(prompts) > MAX_INPUTS:
        raise invalid("prompt", f"'prompt' must be a string or a list of 1 to {MAX_INPUTS} strings")
    inputs = [text_of(p, "prompt" if len(prompts) == 1 else f"prompt[{i}]") for i, p in enumerate(prompts)]
    options = {**sampling_options(body), "raw": True, "stream": _stream_flag(body)}
    return JobSpec("generate", inputs, options, model=model_of(body))


# --------------------------------------------------------------------------- embeddings, audio, images


def _embeddings(path: str, body: dict, uploads: Uploads | None, allow_paths: bool) -> JobSpec:
    check_fields(body, {"model", "input", "encoding_format"})
    if body.get("encoding_format") not in (None, "float", "base64"):
        raise invalid("encoding_format", "'encoding_format' must be float or base64")
    value = body.get("input")
    texts = value if isinstance(value, list) else [value]
    if not texts or len(texts) > MAX_INPUTS:
        raise invalid("input", f"'input' must be a string or a list of 1 to {MAX_INPUTS} strings")
    if any(isinstance(t, (int, list)) for t in texts):
        raise unsupported("input", "token arrays; send the texts")
    inputs = [text_of(t, "input" if len(texts) == 1 else f"input[{i}]") for i, t in enumerate(texts)]
    return JobSpec("embed", inputs, {}, model=model_of(body))


def _audio(path: str, body: dict, uploads: Uploads | None, allow_paths: bool) -> JobSpec:
    translate = path == TRANSLATIONS
    known = {
        "model",
        "file",
        "response_format",
        "temperature",
        "timestamp_granularities",
        "timestamp_granularities[]",
        "stream",
    } | (set() if translate else {"language"})
    check_fields(body, known)
    fmt = body.get("response_format") or "json"
    if fmt not in ("json", "text", "srt", "vtt", "verbose_json"):
        raise invalid("response_format", "'response_format' must be json, text, srt, vtt or verbose_json")
    if typed(body, "temperature", (int, float), "a number") not in (None, 0):
        raise unsupported("temperature", "taskrun decodes Whisper with beam search, temperature 0")
    if typed(body, "stream", bool, "true or false"):
        raise unsupported(
            "stream",
            "transcripts are answered whole; use POST /v1/tasks/transcribe "
            'with "stream": true for segments as they are decoded',
        )
    options: dict[str, Any] = {"task": "translate" if translate else "transcribe"}
    language = typed(body, "language", str, "a language code such as en")
    if language:
        options["language"] = language
    grains = granularities(body)
    if "word" in grains or fmt in ("srt", "vtt"):
        # srt/vtt cues are cut between words, as the CLI's `-f srt` does (Transcribe's
        # options_for_format): without word times the server's cues came out different.
        options["word_timestamps"] = True
    return JobSpec("transcribe", [_audio_input(body.get("file"), uploads, allow_paths)], options, model=model_of(body))


def granularities(body: dict) -> list[str]:
    value = body.get("timestamp_granularities[]", body.get("timestamp_granularities")) or []
    grains = [value] if isinstance(value, str) else value
    if not isinstance(grains, list) or not set(grains) <= {"segment", "word"}:
        raise invalid("timestamp_granularities", "'timestamp_granularities' takes segment and/or word")
    if grains and body.get("response_format") != "verbose_json":
        raise invalid("timestamp_granularities", "timestamp_granularities needs response_format verbose_json")
    return grains


def _audio_input(file: Any, uploads: Uploads | None, allow_paths: bool) -> Input:
    if isinstance(file, str) and allow_paths:
        return file_input(file)
    name, data = file if isinstance(file, tuple) else ("audio", file)
    if not isinstance(data, (bytes, bytearray)):
        raise invalid("file", "'file' must be an uploaded audio file (multipart/form-data)")
    if uploads is None:
        raise unsupported("file", "uploads are not accepted here")
    return uploads.add(bytes(data), str(name or "audio"))


def _images(path: str, body: dict, uploads: Uploads | None, allow_paths: bool) -> JobSpec:
    """Steps and seed are taskrun's extra fields; the images are PNGs written in the request's
    folder and answered inline (b64_json), never as URLs."""
    check_fields(
        body, {"model", "prompt", "n", "size", "response_format", "seed", "steps", "negative", "guidance", "label"}
    )
    if body.get("response_format") not in (None, "b64_json"):
        raise unsupported("response_format", "images are answered inline: use b64_json (there are no URLs)")
    options: dict[str, Any] = {}
    n = typed(body, "n", int, "a whole number")
    if n is not None:
        if not 1 <= n <= MAX_IMAGES:
            raise invalid("n", f"'n' must be between 1 and {MAX_IMAGES} (got {n})")
        options["n"] = n
    size = typed(body, "size", str, "WIDTHxHEIGHT such as 256x256")
    if size and size != "auto":
        options["size"] = size
    # "'seed' must be a number (got 0.0)" misled: the whole numbers say so
    for key, kind, what in (
        ("seed", int, "a whole number"),
        ("steps", int, "a whole number"),
        ("negative", str, "a string"),
        ("guidance", (int, float), "a number"),
        ("label", str, "a string"),
    ):
        value = typed(body, key, kind, what)
        if value is not None:
            options[key] = value
    if uploads is None:
        raise unsupported("prompt", "images need a folder to be written to here")
    options["out_dir"] = str(uploads.dir)
    prompt = body.get("prompt")
    inputs = [text_of(prompt, "prompt")] if prompt not in (None, "") else []
    return JobSpec("image", inputs, options, model=model_of(body))


def openai_body(path: str, spec: JobSpec, rec, body: dict) -> dict | str:
    """The non-streaming response to ``body`` (sent to ``path``) once its job ``rec`` has
    finished: a JSON object, or text for audio's text, srt and vtt formats."""
    if path in (CHAT, COMPLETIONS):
        asked = tools.tool_request(body) if path == CHAT else None
        return openai_out.completion_body(path == CHAT, spec, rec, asked)
    if path == EMBEDDINGS:
        return openai_out.embeddings_body(spec, rec, body.get("encoding_format"))
    if path in (TRANSCRIPTIONS, TRANSLATIONS):
        return openai_out.transcript_body(
            rec,
            body.get("response_format") or "json",
            "word" in granularities(body),
            spec.options.get("task", "transcribe"),
        )
    if path == IMAGES:
        return openai_out.images_body(rec)
    raise APIError(404, f"no OpenAI endpoint {path}", code="not_found")


_PARSERS: dict[str, Callable[[str, dict, Uploads | None, bool], JobSpec]] = {
    CHAT: _chat,
    COMPLETIONS: _completions,
    EMBEDDINGS: _embeddings,
    TRANSCRIPTIONS: _audio,
    TRANSLATIONS: _audio,
    IMAGES: _images,
}

__all__ = ["TASK_OF", "APIError", "job_from_openai", "openai_body", "openapi_body"]
