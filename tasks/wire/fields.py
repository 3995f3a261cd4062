"""The request-field layer every OpenAI and Ollama parser shares: the size limits, the fields that
are accepted only at their neutral value, and the typed reads that answer a bad field with a 400
naming it and the form it takes.
"""

from __future__ import annotations

import json
from typing import Any

from taskrun.tasks.base import Input, TaskError
from taskrun.tasks.inputs import text_input
from taskrun.tasks.wire.errors import invalid, unsupported

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
