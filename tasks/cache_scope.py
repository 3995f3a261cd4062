"""Whose prompt cache a job may read: the tenant a server job runs for.

Why: a prompt cache that one client's job fills and the next client's job reads tells the second
client, through ``cached_tokens`` (Ollama's ``prompt_eval_cached_count``) and through the time
to its first token, how much of its prompt matched the first client's; probing prefix by prefix
recovers another client's prompt (issue 33, item 4). vLLM salts its cache per tenant for this
reason. A job carries a scope: cached prefixes are reused only by a job of the same scope, and a
job of another scope reads its prompt whole (and reports 0 cached tokens).

``run serve --prompt-cache``: ``tenant`` (default) scopes by API key (one tenant when the server
has no keys), ``shared`` is one scope for everyone, ``off`` reads every prompt whole. Outside the
server (a CLI job, `run chat`) the scope is the process's own: ``LOCAL``.

A context variable, set by the server around each job on the thread that runs it, read by the
engines that keep a prompt cache; torch-free, so it sits with the task contract.
"""

from __future__ import annotations

from contextvars import ContextVar

LOCAL = "local"  # the one scope of a process that serves only its own user
OFF = None  # no reuse at all: every prompt read whole

SCOPE: ContextVar[str | None] = ContextVar("taskrun_prompt_cache_scope", default=LOCAL)


def current() -> str | None:
    """The running job's scope; None (OFF) means no cached prefix may be reused."""
    return SCOPE.get()


def for_tenant(mode: str, tenant: str) -> str | None:
    """The scope of a job for ``tenant`` (an opaque id of its API key, "" without keys) under
    ``--prompt-cache mode``."""
    if mode == "off":
        return OFF
    if mode == "shared":
        return "shared"
    return "tenant:" + tenant
