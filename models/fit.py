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


# llama.cpp (a GGUF on its default runtime). Its weights are read into memory (not mapped), its
# KV cache is float16 and sized as the engine makes it (512 tokens at least, then powers of two:
# pipelines/llm/llamacpp.py ``_size``), its compute buffers grow with heads x KV size, and a small
# 4-bit GGUF also holds a float16 copy that reads prompts, with a second context of its own.
# Calibrated on measured peak RSS (`/usr/bin/time -f %M run generate --max-tokens 8 --temperature 0`,
# 2026-12-02, 2 busy cores), for "Hi" (a 512-token cache) and a 1,613-token prompt (2,048):
# qwen2.5-coder-1.5b 1.242 / 1.348 GB (estimate 1.25 / 1.35), smollm2-135m with its prompt copy
# 0.483 / 0.603 GB (estimate 0.53 / 0.67): all within 12%.
LLAMACPP_OVERHEAD = 100 * 1024**2  # Python, taskrun, llama.cpp's runtime
LLAMACPP_HEAD_TOKEN = 2600  # compute-buffer bytes per attention head per KV-cache token, per context
LLAMACPP_MIN_CTX = 512


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
    """llama.cpp's memory: the GGUF read into memory, a float16 KV cache and compute buffers for
    the cache llama.cpp makes (rounded up), and the float16 prompt copy where one is used."""
    from taskrun.models.gguf import copy_bytes, file_type, wants_prompt_copy

    shape = _shape(card)
    path = gguf_path(card)
    head_dim = shape["hidden"] // shape["heads"]
    n_ctx = LLAMACPP_MIN_CTX
    while n_ctx < context:
        n_ctx *= 2
    n_ctx = max(context, min(n_ctx, shape["max_context"] or n_ctx))
    copy = wants_prompt_copy(path, file_type(gguf_metadata(path)))
    contexts = 2 if copy else 1  # the copy reads prompts in a context of its own
    kv = 2 * shape["layers"] * shape["kv_heads"] * head_dim * n_ctx * batch * 2 * contexts
    buffers = LLAMACPP_HEAD_TOKEN * shape["heads"] * n_ctx * batch * contexts
    weights = path.stat().st_size + (copy_bytes(path) if copy else 0)
    return _verdict(card, shape, context, batch, "gguf", weights, kv, buffers + LLAMACPP_OVERHEAD, "llama.cpp")


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
