"""The one error shape every endpoint answers with: OpenAI's ``{"error": {...}}``.

OpenAI's clients (and most others) read ``error.message`` from any 4xx/5xx, so the native and
Ollama endpoints use the same body. Torch- and web-framework-free: ``run batch`` writes these
bodies into its error lines too.
"""

from __future__ import annotations

import re
import sys

from taskrun.tasks.base import TaskError


class APIError(Exception):
    """A request that cannot be served, with the HTTP status and OpenAI error fields to answer with.

    ``param`` names the request field at fault (OpenAI's clients show it); ``code`` is a
    machine-readable reason such as ``model_not_found``.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# A TaskError from model resolution that means "no such model here" (models/resolve.py words
# them so); it answers 404 like OpenAI's unknown model, every other TaskError 400.
_NOT_FOUND_PREFIXES = ("no model named",)
_NOT_FOUND_PARTS = ("is not available here", "is not installed here")


# The CLI's words in a TaskError → the request fields an API client sets (longest first)
_API_WORDS = (
    ("Shorten it, or pass --truncate to cut its end", "Shorten it, or lower max_tokens"),
    ("--json-schema", "the JSON schema"),
    ("--max-tokens", "max_tokens"),
    ("--system", "the system prompt"),
    ("--size", "size"),
)
_CONTEXT_EXCEEDED = "(prompt + answer)"  # pipelines/llm/generate.py's refusal of a prompt too long


def api_words(message: str) -> str:
    """A TaskError's message with the CLI flags it names put as the API fields that do the same."""
    for cli, api in _API_WORDS:
        message = message.replace(cli, api)
    return message


def from_task_error(exc: TaskError) -> APIError:
    """The API error for a job's TaskError: its message (which names the fix, in the API's
    words), 400 (code ``context_length_exceeded`` for a prompt too long, as OpenAI's), or 404
    with code ``model_not_found`` when the model is unknown or not installed."""
    message = str(exc)
    if message.startswith(_NOT_FOUND_PREFIXES) or any(p in message for p in _NOT_FOUND_PARTS):
        return APIError(404, message, param="model", code="model_not_found")
    code = "context_length_exceeded" if _CONTEXT_EXCEEDED in message else None
    return APIError(400, api_words(message), param=exc.param, code=code)


def unsupported(field: str, why: str = "") -> APIError:
    """400 for a request field taskrun does not implement: named, never silently ignored."""
    return APIError(
        400,
        f"'{field}' is not supported by this server" + (f": {why}" if why else ""),
        param=field,
        code="unsupported_parameter",
    )


def invalid(field: str, message: str) -> APIError:
    """400 for a field with a wrong type or value."""
    return APIError(400, message, param=field, code="invalid_value")


# --------------------------------------------------------------------------- what an HTTP client reads

_FLAG = re.compile(r"(?<![\w-])(?:run [a-z]+ )?--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
# `run serve` options an error may tell a client to ask the operator for: they stay flags
OPERATOR_FLAGS = frozenset(
    {"client-runtimes", "allowed-origins", "max-body-mb", "max-queue", "max-memory", "api-key", "parallel"}
)
_UPLOAD = re.compile(r"[^\s'\"`(]*taskrun-upload-[A-Za-z0-9_-]+/(?:\d{4}-)?")


def public(err: APIError, corpora: dict[str, str] | None = None) -> APIError:
    """``err`` as an HTTP client may read it: no path of the server's (an upload's temporary
    folder is dropped, a served corpus is its NAME, the server's install is ``<server>``) and no
    command-line flag (a job's ``--json-schema`` is the request's ``'json_schema'``). Changed in
    place, so a subclass's extras (run id, Retry-After) stay."""
    err.message = public_text(err.message, corpora)
    return err


def public_text(text: str, corpora: dict[str, str] | None = None) -> str:
    for name, folder in sorted((corpora or {}).items(), key=lambda kv: -len(kv[1])):
        text = text.replace(folder, name)
    text = _UPLOAD.sub("", text)
    if sys.prefix and len(sys.prefix) > 1:
        text = text.replace(sys.prefix, "<server>")
    return _FLAG.sub(
        lambda m: m.group(0) if m.group(1) in OPERATOR_FLAGS else "'" + m.group(1).replace("-", "_") + "'", text
    )
