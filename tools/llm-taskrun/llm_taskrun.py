"""An `llm` plugin: embedding models served by `run serve` (its OpenAI-compatible /v1/embeddings).

llm's extra-openai-models.yaml declares chat models only, so `llm embed` has no way to reach an
OpenAI-compatible embeddings endpoint; this plugin registers one embedding model per name in
TASKRUN_LLM_EMBED_MODELS (comma-separated server aliases, e.g. ``minilm``), each as
``taskrun/<alias>``. The server is TASKRUN_URL (default http://127.0.0.1:8080, `run serve`'s
default port); a keyed server's key is read from TASKRUN_API_KEY (or ``llm keys set taskrun``).
"""

from __future__ import annotations

import os

import llm

DEFAULT_URL = "http://127.0.0.1:8080"


def server_url() -> str:
    """The server's base URL, without a trailing slash and without /v1."""
    return os.environ.get("TASKRUN_URL", DEFAULT_URL).rstrip("/").removesuffix("/v1")


class TaskrunEmbed(llm.EmbeddingModel):
    """One embedding model of a `run serve` server, called through the openai client."""

    needs_key = "taskrun"
    key_env_var = "TASKRUN_API_KEY"
    batch_size = 32  # one /v1/embeddings request per 32 items; the server batches further

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.model_id = f"taskrun/{alias}"

    def embed_batch(self, items):
        import openai  # imported here: llm loads every plugin on each command

        # A loopback server without --api-key takes any key; the openai client insists on one.
        client = openai.OpenAI(base_url=server_url() + "/v1", api_key=self.get_key() or "none")
        texts = [i.decode("utf-8") if isinstance(i, bytes) else i for i in items]
        answer = client.embeddings.create(model=self.alias, input=texts)
        for row in sorted(answer.data, key=lambda d: d.index):
            yield list(row.embedding)

    def get_key(self, explicit_key=None):
        # needs_key makes llm raise when no key is set; an open server needs none.
        try:
            return super().get_key(explicit_key)
        except llm.NeedsKeyException:
            return None


def model_aliases() -> list[str]:
    return [a.strip() for a in os.environ.get("TASKRUN_LLM_EMBED_MODELS", "").split(",") if a.strip()]


@llm.hookimpl
def register_embedding_models(register):
    for alias in model_aliases():
        register(TaskrunEmbed(alias))
