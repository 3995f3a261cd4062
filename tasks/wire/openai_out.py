"""Finished taskrun jobs → OpenAI response bodies and streaming chunks.

The shapes are those the official ``openai`` Python client parses. Fields OpenAI has and taskrun
cannot fill truthfully (log-probabilities, Whisper's per-segment decoding statistics) are left
out rather than made up. ``run_id`` (the run-log id) is added where a header cannot carry it: the
last chunk of a stream.
"""

from __future__ import annotations

import base64
import time
from typing import Any

# generate's finish reasons → OpenAI's (a stop sequence is a plain "stop" there)
FINISH = {"stop": "stop", "length": "length", "stop_sequence": "stop"}


def finish_reason(reason: str | None) -> str | None:
    return None if reason is None else FINISH.get(reason, "stop")


def model_name(spec, rec) -> str:
    return spec.model or (rec.card.name if rec is not None and rec.card is not None else "")


def usage(results: list, metrics=None) -> dict:
    """OpenAI usage from generate results: prompt tokens after the chat template, and of them the
    ones kept from the model's prompt cache (``prompt_tokens_details.cached_tokens``, as OpenAI
    reports its own prompt caching)."""
    prompt = sum(r.input_tokens for r in results)
    completion = sum(r.output_tokens for r in results)
    cached = int(getattr(metrics, "cached_prompt_tokens", 0) or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chat_message(r, asked=None) -> tuple[dict, str | None]:
    """(the assistant message, its finish reason): with tools asked for, the calls the answer
    holds become ``tool_calls`` and the reason ``tool_calls`` (tasks/wire/tools.py)."""
    reason = finish_reason(r.finish_reason)
    if asked is None:
        return {"role": "assistant", "content": r.text, "refusal": None}, reason
    content, calls = asked.calls(r)
    message: dict = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
        reason = "tool_calls"
    return message, reason


def completion_body(chat: bool, spec, rec, asked=None) -> dict:
    """A chat.completion or text_completion object, one choice per prompt."""
    results = rec.results
    if chat:
        choices = []
        for i, r in enumerate(results):
            message, reason = chat_message(r, asked)
            choices.append({"index": i, "message": message, "finish_reason": reason, "logprobs": None})
    else:
        choices = [
            {"index": i, "text": r.text, "finish_reason": finish_reason(r.finish_reason), "logprobs": None}
            for i, r in enumerate(results)
        ]
    return {
        "id": ("chatcmpl-" if chat else "cmpl-") + rec.id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name(spec, rec),
        "choices": choices,
        "usage": usage(results, rec.metrics),
        "system_fingerprint": _fingerprint(rec),
    }


def _fingerprint(rec) -> str | None:
    """The weights' digest: the same fingerprint means the same model (OpenAI's meaning)."""
    return None if rec.card is None else "fp_" + rec.card.digest.removeprefix("sha256:")[:12]


def embeddings_body(spec, rec, encoding_format: str | None) -> dict:
    """Vectors as float lists, or base64 of little-endian float32 (what OpenAI sends and its
    client decodes with numpy)."""
    import numpy as np

    data = []
    for i, r in enumerate(rec.results):
        vec = np.asarray(r.vector, dtype="<f4")
        value: Any = base64.b64encode(vec.tobytes()).decode() if encoding_format == "base64" else vec.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(r.tokens for r in rec.results)
    return {
        "object": "list",
        "data": data,
        "model": model_name(spec, rec),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def transcript_body(rec, response_format: str, words: bool, task: str) -> dict | str:
    """json {"text"}, text, srt, vtt (the CLI's own writers), or verbose_json with segments."""
    from taskrun.tasks.transcribe import TASK, to_txt

    items = rec.results
    fmt = response_format or "json"
    if fmt in ("srt", "vtt"):
        return TASK.write(items, fmt, None, rec.options)
    if fmt == "text":
        return to_txt(items)
    tr = items[0]
    if fmt == "json":
        return {"text": tr.text}
    segments = [{"id": i, "start": s.start, "end": s.end, "text": s.text} for i, s in enumerate(tr.segments)]
    body = {"task": task, "language": tr.language, "duration": tr.audio_s, "text": tr.text, "segments": segments}
    if words:
        body["words"] = [{"word": w.word, "start": w.start, "end": w.end} for s in tr.segments for w in (s.words or ())]
    return body


def images_body(rec) -> dict:
    """Each image as a base64 PNG, with its settings in the PNG's text chunks as the CLI writes them."""
    from taskrun.tasks.image import png_bytes

    data = []
    for gen in rec.results:
        for im in gen.images:
            png = png_bytes(im.pixels, gen.png_text(im))
            data.append({"b64_json": base64.b64encode(png).decode(), "revised_prompt": None})
    return {"created": int(time.time()), "data": data}


# --------------------------------------------------------------------------- streaming


class CompletionChunks:
    """The chunks of one streamed chat or text completion, in OpenAI's order: a role chunk
    (chat), a chunk per piece of text, a finishing chunk per choice, then (with
    ``stream_options.include_usage``) a usage chunk with no choices."""

    def __init__(self, chat: bool, model: str, include_usage: bool, request_id: str, asked=None) -> None:
        self.chat, self.model, self.include_usage = chat, model, include_usage
        self.asked = asked  # tools asked for: each choice's text read by a ToolStream (tasks/wire/tools.py)
        self._streams: dict = {}  # choice index → its ToolStream
        self._sent: dict[int, int] = {}  # choice index → tool calls sent
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.created = int(time.time())

    def _chunk(self, choices: list, **extra) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def start(self) -> list[dict]:
        if not self.chat:
            return []
        delta = {"role": "assistant", "content": ""}
        return [self._chunk([{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}])]

    def _delta(self, index: int, delta: dict) -> dict:
        return self._chunk([{"index": index, "delta": delta, "finish_reason": None, "logprobs": None}])

    def _stream(self, index: int):
        from taskrun.tasks.wire.tool_stream import ToolStream

        if index not in self._streams:
            self._streams[index] = ToolStream(self.asked)
        return self._streams[index]

    def _parts(self, index: int, parts) -> list[dict]:
        """Chunks for a tool stream's parts: text as content deltas, each call whole, numbered
        within its choice as OpenAI numbers ``tool_calls[].index``."""
        out = []
        for kind, value in parts:
            if kind == "text":
                out.append(self._delta(index, {"content": value}))
            else:
                n = self._sent.get(index, 0)
                self._sent[index] = n + 1
                out.append(self._delta(index, {"tool_calls": [{"index": n, **value}]}))
        return out

    def piece(self, text: str, index: int) -> list[dict]:
        """The chunks for one piece of a choice's text: itself, or with tools asked for what of
        it is known not to be part of a call (and each call as soon as it is closed)."""
        if self.asked is not None:
            return self._parts(index, self._stream(index).feed(text))
        if self.chat:
            return [self._delta(index, {"content": text})]
        return [self._chunk([{"index": index, "text": text, "finish_reason": None, "logprobs": None}])]

    def end(self, rec) -> list[dict]:
        """The finishing chunks, the last one carrying the run id."""
        results = rec.results
        out = []
        for i, r in enumerate(results):
            reason = finish_reason(r.finish_reason)
            if self.asked is not None:
                stream = self._stream(i)
                out.extend(self._parts(i, stream.close(r)))
                if stream.calls:
                    reason = "tool_calls"
            choice = (
                {"index": i, "delta": {}, "finish_reason": reason, "logprobs": None}
                if self.chat
                else {"index": i, "text": "", "finish_reason": reason, "logprobs": None}
            )
            out.append(self._chunk([choice]))
        if self.include_usage:
            out.append(self._chunk([], usage=usage(results, rec.metrics)))
        if out:
            out[-1]["run_id"] = rec.id
        return out
