"""`run fit`: will a language model fit in memory at a given context? Read from its config or
GGUF header only, never its weights, and without torch."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from taskrun.models.gguf import gguf_file, gguf_metadata
from taskrun.models.resolve import resolve
from taskrun.tasks.base import ModelCard, TaskError

RUNTIME_OVERHEAD = 400 * 1024 ** 2  # torch + transformers + tokenizer, measured ~0.4 GiB on CPU


def estimate_fit(name: str, context: int, batch: int, dtype: str, offline: bool = False) -> dict:
    """Memory for weights + KV cache + overhead at ``context`` × ``batch``, from the model's config
    or GGUF header only, against the RAM available now."""
    card = resolve(name, offline=offline)
    if "generate" not in card.tasks:
        raise TaskError(f"`{card.name}` is a {card.kind or card.architecture} model; fit estimates "
                        f"text-generation models such as smollm2-135m")
    shape = _gguf_shape(card) if _is_gguf(card) else _hf_shape(card)
    nbytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    head_dim = shape["hidden"] // shape["heads"]
    kv = 2 * shape["layers"] * shape["kv_heads"] * head_dim * context * batch * nbytes
    # Prefill activations: a few hidden-size and one MLP-size tensor per token, one layer at a time.
    act = batch * context * (4 * shape["hidden"] + 2 * shape["ffn"]) * 4
    total = shape["params"] * nbytes + kv + act + RUNTIME_OVERHEAD
    avail = _available_ram()
    notes = []
    if context > shape["max_context"]:
        notes.append(f"--context {context} is beyond the model's window of {shape['max_context']} tokens: "
                     f"generate refuses longer prompts (or cuts them with --truncate)")
    if total > 0.9 * avail and total <= avail:
        notes.append("under 10% of the available RAM would be left; other processes may push it out")
    return {"model": card.name, "architecture": card.architecture, "params": shape["params"],
            "layers": shape["layers"], "max_context": shape["max_context"], "context": context, "batch": batch,
            "dtype": dtype, "weights_bytes": shape["params"] * nbytes, "kv_bytes": kv,
            "overhead_bytes": act + RUNTIME_OVERHEAD, "total_bytes": total, "available_bytes": avail,
            "fits": total <= avail, "notes": notes}


def _is_gguf(card: ModelCard) -> bool:
    return gguf_file(card) is not None


def _gguf_shape(card: ModelCard) -> dict:
    meta = gguf_metadata(gguf_file(card), tensors=True)  # the header only: milliseconds, not seconds
    arch = meta.get("general.architecture")

    def field(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    heads = field("attention.head_count")
    return {"params": int(meta["taskrun.parameters"]), "layers": field("block_count"),
            "hidden": field("embedding_length"), "heads": heads,
            "kv_heads": field("attention.head_count_kv", heads),
            "ffn": field("feed_forward_length", 0), "max_context": field("context_length", 0)}


def _hf_shape(card: ModelCard) -> dict:
    folder = Path(card.path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    params = 0
    for f in folder.glob("*.safetensors"):  # the header alone gives every tensor's shape
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                size = 1
                for d in v["shape"]:
                    size *= d
                params += size
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    ffn = cfg.get("intermediate_size", 4 * hidden)
    if not params:  # no safetensors (e.g. .bin): count from the config
        params = layers * (4 * hidden * hidden + 3 * hidden * ffn) + cfg["vocab_size"] * hidden
    return {"params": params, "layers": layers, "hidden": hidden, "heads": cfg["num_attention_heads"],
            "kv_heads": cfg.get("num_key_value_heads", cfg["num_attention_heads"]), "ffn": ffn,
            "max_context": cfg.get("max_position_embeddings", 0)}


def _available_ram() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
