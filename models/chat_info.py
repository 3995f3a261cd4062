"""A language model's chat template and context window, read from its files without loading it:
a GGUF's header (``tokenizer.chat_template``, ``ARCH.context_length``) or a transformers folder
(chat_template.jinja or tokenizer_config.json; config.json's position limit). Ollama's /api/show
reports them, and clients such as litellm read their context window and tool support there.
"""

from __future__ import annotations

import json
from pathlib import Path

from taskrun.tasks.base import TaskError

_WINDOW_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def chat_info(path: str) -> dict:
    """``family``, ``template`` ("" where none) and ``context_length`` (0 where unknown)."""
    p = Path(path)
    if p.suffix == ".gguf":
        from taskrun.models.gguf import gguf_metadata

        try:
            meta = gguf_metadata(p)
        except TaskError:
            return {"family": "", "template": "", "context_length": 0}
        family = str(meta.get("general.architecture", ""))
        return {
            "family": family,
            "template": str(meta.get("tokenizer.chat_template", "") or ""),
            "context_length": int(meta.get(f"{family}.context_length", 0) or 0),
        }
    if not p.is_dir():
        return {"family": "", "template": "", "context_length": 0}
    config = _json(p / "config.json")
    window = next((config[k] for k in _WINDOW_KEYS if isinstance(config.get(k), int)), 0)
    template = ""
    if (p / "chat_template.jinja").is_file():
        template = (p / "chat_template.jinja").read_text(errors="replace")
    else:
        found = _json(p / "tokenizer_config.json").get("chat_template", "")
        template = found if isinstance(found, str) else ""  # a list of named templates: none chosen
    return {"family": str(config.get("model_type", "")), "template": template, "context_length": window}


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
