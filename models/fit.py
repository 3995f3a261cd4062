"""`run fit`: will a language model fit in memory at a given context? Read from its config or
GGUF header only, never its weights, and without torch."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from taskrun.models.gguf import gguf_file, gguf_metadata, gguf_path
from taskrun.models.resolve import resolve
from taskrun.tasks.base import ModelCard, TaskError

# torch + transformers + tokenizer + allocator slack, calibrated on the measured peak RSS of
# smollm2-135m on `--runtime transformers` (CPU, 2026-11-30, /usr/bin/time -f %M): 1.67 GB for a
# 2-token prompt and 2.07 GB for a 6,649-token one, against 1.03 GB and 1.47 GB of weights, KV
# cache and prefill activations as counted below (the estimate is within 3% of both).
RUNTIME_OVERHEAD = 610 * 1024**2
PREFILL_CHUNK = 512  # prompt tokens per forward pass (pipelines/llm/hf_engine.py reads prompts in chunks)
# The lean Llama pass (pipelines/llm/llama_fast.py) on CPU keeps a float16 copy of each projection
# for decoding and a bfloat16 one for prompts, beside the float32 embeddings: 4 more bytes a weight.
REPACK_BYTES = 4
REPACKED = ("LlamaForCausalLM", "MistralForCausalLM", "llama", "mistral")


# llama.cpp (a GGUF on its default runtime), calibrated the same way on smollm2-135m: 0.37 GB peak
# for a 2-token prompt, 1.05 GB for 6,590 tokens. Its weights are the file, mapped; its KV cache
# is float16; its prompt pass keeps about 4.5 copies of a batch's attention scores (no flash
# attention on CPU), which grows with the context: 81 KB a token here, beside 22.5 KB of KV.
LLAMACPP_OVERHEAD = 260 * 1024**2
LLAMACPP_BATCH = 512
LLAMACPP_SCORE_COPIES = 4.5


def estimate_fit(
    name: str, context: int, batch: int, dtype: str, offline: bool = False, runtime: str | None = None
) -> dict:
    """Memory for weights + KV cache + overhead at ``context`` × ``batch``, from the model's config
    or GGUF header only, against the RAM available now, on ``runtime`` (default: the model's)."""
    card = resolve(name, offline=offline)
    if (runtime or card.runtime) == "llama.cpp" and _is_gguf(card):
        return _llamacpp_fit(card, context, batch)
    shape = _shape(card)
    nbytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    head_dim = shape["hidden"] // shape["heads"]
    per_token = 2 * shape["layers"] * shape["kv_heads"] * head_dim * batch * nbytes
    kv = per_token * context
    repacked = dtype == "float32" and card.architecture in REPACKED  # taskrun's CPU default path
    # The lean pass sizes its cache in powers of two (at least 512 tokens): the slack is reserved too.
    slack = per_token * (max(512, 1 << max(0, context - 1).bit_length()) - context) if repacked else 0
    # Prefill activations, a chunk of the prompt at a time: a few hidden-size and two MLP-size
    # tensors per token, and one tile of attention scores (heads x chunk x context).
    chunk = min(context, PREFILL_CHUNK)
    act = batch * chunk * ((4 * shape["hidden"] + 2 * shape["ffn"]) + shape["heads"] * context) * 4
    embed = shape.get("embed", 0)
    extra = (shape["params"] - embed) * REPACK_BYTES if repacked else 0
    return _verdict(
        card,
        shape,
        context,
        batch,
        dtype,
        shape["params"] * nbytes + extra,
        kv,
        act + slack + RUNTIME_OVERHEAD,
        "transformers",
    )


def _shape(card: ModelCard) -> dict:
    if "generate" not in card.tasks:
        raise TaskError(
            f"`{card.name}` is a {card.kind or card.architecture} model; fit estimates "
            f"text-generation models such as smollm2-135m"
        )
    return _gguf_shape(card) if _is_gguf(card) else _hf_shape(card)


def _llamacpp_fit(card: ModelCard, context: int, batch: int) -> dict:
    """llama.cpp's memory: the GGUF file (mapped), a float16 KV cache, its prompt pass's score buffers."""
    shape = _shape(card)
    head_dim = shape["hidden"] // shape["heads"]
    kv = 2 * shape["layers"] * shape["kv_heads"] * head_dim * context * batch * 2
    scores = int(LLAMACPP_SCORE_COPIES * shape["heads"] * LLAMACPP_BATCH * 4 * context * batch)
    return _verdict(
        card, shape, context, batch, "gguf", gguf_path(card).stat().st_size, kv, scores + LLAMACPP_OVERHEAD, "llama.cpp"
    )


def _verdict(
    card: ModelCard,
    shape: dict,
    context: int,
    batch: int,
    dtype: str,
    weights: int,
    kv: int,
    overhead: int,
    runtime: str,
) -> dict:
    """The estimate as `run fit` shows it, with the verdict against the RAM available now."""
    total = weights + kv + overhead
    avail = _available_ram()
    notes = []
    if context > shape["max_context"]:
        notes.append(
            f"--context {context} is beyond the model's window of {shape['max_context']} tokens: "
            f"generate refuses longer prompts (or cuts them with --truncate)"
        )
    if total > 0.9 * avail and total <= avail:
        notes.append("under 10% of the available RAM would be left; other processes may push it out")
    return {
        "model": card.name,
        "architecture": card.architecture,
        "params": shape["params"],
        "layers": shape["layers"],
        "max_context": shape["max_context"],
        "context": context,
        "batch": batch,
        "dtype": dtype,
        "runtime": runtime,
        "weights_bytes": weights,
        "kv_bytes": kv,
        "overhead_bytes": overhead,
        "total_bytes": total,
        "available_bytes": avail,
        "fits": total <= avail,
        "notes": notes,
    }


def _is_gguf(card: ModelCard) -> bool:
    return gguf_file(card) is not None


def _gguf_shape(card: ModelCard) -> dict:
    meta = gguf_metadata(gguf_path(card), tensors=True)  # the header only: milliseconds, not seconds
    arch = meta.get("general.architecture")

    def field(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    heads = field("attention.head_count")
    return {
        "params": int(meta["taskrun.parameters"]),
        "layers": field("block_count"),
        "hidden": field("embedding_length"),
        "heads": heads,
        "kv_heads": field("attention.head_count_kv", heads),
        "ffn": field("feed_forward_length", 0),
        "max_context": field("context_length", 0),
        "embed": _gguf_vocab(meta) * field("embedding_length"),
    }


def _gguf_vocab(meta: dict) -> int:
    """The vocabulary size of a GGUF, from its token list (or its own field when it has one)."""
    arch = meta.get("general.architecture")
    tokens = meta.get("tokenizer.ggml.tokens")
    return int(meta.get(f"{arch}.vocab_size") or (len(tokens) if tokens is not None else 0))


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
    return {
        "params": params,
        "layers": layers,
        "hidden": hidden,
        "heads": cfg["num_attention_heads"],
        "kv_heads": cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        "ffn": ffn,
        "max_context": cfg.get("max_position_embeddings", 0),
        "embed": cfg.get("vocab_size", 0) * hidden,
    }


def _available_ram() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
