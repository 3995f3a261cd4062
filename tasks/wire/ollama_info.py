"""Ollama's informational answers from the server's catalogue rows: /api/show, /api/ps, /api/version,
and the clear refusals of /api/pull and /api/delete (a taskrun server serves a local catalogue).
Torch- and web-framework-free.
"""

from __future__ import annotations

from datetime import datetime, timezone

from taskrun.tasks.wire.errors import APIError, invalid

# The Ollama API version this server answers like (the ollama client pinned in the tests speaks it)
OLLAMA_API_VERSION = "0.6.3"
NEVER = "2318-11-04T23:59:59Z"  # Ollama's expires_at for a model kept loaded (keep_alive -1)
CAPABILITIES = {"generate": "completion", "chat": "completion", "embed": "embedding"}


def find(rows: list[dict], body: dict) -> dict:
    """The catalogue row ``body["model"]`` (or Ollama's older ``name``) names; 404 in Ollama's words."""
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("model", "'model' must name a model (GET /api/tags lists them)")
    bare = name.removesuffix(":latest")
    row = next((r for r in rows if r["name"] in (name, bare)), None)
    if row is None:
        raise APIError(404, f"model '{name}' not found", param="model", code="model_not_found")
    return row


def details(row: dict) -> dict:
    return {
        "parent_model": "",
        "format": row.get("format", ""),
        "family": row.get("architecture", ""),
        "families": [row.get("architecture", "")],
        # `run models`' columns (models.toml's keys, else the GGUF header): models/provenance.py
        "parameter_size": row.get("parameters", ""),
        "quantization_level": row.get("quantisation", ""),
    }


def show_body(row: dict, chat: dict | None = None) -> dict:
    """``chat``: the model's ``family``, chat ``template`` and ``context_length`` where it has
    them (models/chat_info.py); the template is the model's own (Jinja), not a Go template."""
    caps = sorted({CAPABILITIES[t] for t in row["tasks"] if t in CAPABILITIES})
    chat = chat or {}
    model_info: dict = {"general.architecture": chat.get("family") or row.get("architecture", "")}
    if chat.get("context_length"):
        model_info[f"{model_info['general.architecture']}.context_length"] = chat["context_length"]
    return {
        "modelfile": f"FROM {row['name']}\n",
        "parameters": "",
        "template": chat.get("template", ""),
        "details": details(row),
        "model_info": model_info,
        "capabilities": caps,
        "modified_at": datetime.fromtimestamp(row.get("created", 0), timezone.utc).isoformat().replace("+00:00", "Z"),
    }


def ps_body(rows: list[dict], loaded: set[str]) -> dict:
    """The models loaded now (``loaded``: their weights' digests)."""
    models = []
    for r in rows:
        if r["digest"] in loaded:
            models.append(
                {
                    "name": r["name"],
                    "model": r["name"],
                    "size": r["size_bytes"],
                    "digest": r["digest"].removeprefix("sha256:"),
                    "details": details(r),
                    "expires_at": NEVER,
                    "size_vram": 0,
                }
            )
    return {"models": models}


def pull_refused(body: dict, rows: list[dict]) -> APIError:
    name = body.get("model") or body.get("name") or ""
    here = any(r["name"] in (name, str(name).removesuffix(":latest")) for r in rows)
    if here:
        why = f"model '{name}' is already on this server (GET /api/tags lists it); nothing to pull"
    else:
        why = (
            f"this server does not download models: '{name}' must be installed on the server's machine "
            "(its catalogue is GET /api/tags)"
        )
    return APIError(400, why, param="model")


def delete_refused(body: dict) -> APIError:
    name = body.get("model") or body.get("name") or ""
    return APIError(400, f"this server does not delete models: remove '{name}' on the server's machine", param="model")
