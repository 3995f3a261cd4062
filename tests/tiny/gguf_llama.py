"""The tiny random Llama of tests/tiny/generate.py written as a GGUF file with the ``gguf``
package, so the llama.cpp engine's fast tests need no weight package.

The same weights and tokenizer as the HF folder (float32 tensors, so both engines compute the same
function): the llama tensors under llama.cpp's names (q and k rows permuted to llama.cpp's rotary
layout, as llama.cpp's convert_hf_to_gguf.py does), and the byte-level BPE vocabulary, merges,
special ids and chat template as ``tokenizer.ggml.*`` metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tiny import done, once
from tests.tiny.generate import build as build_hf


def _permute(w, n_head: int):
    """HF's rotate-half q/k rows → llama.cpp's interleaved pairs (convert_hf_to_gguf's permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(state: dict, cfg) -> dict:
    """llama.cpp's tensor names → float32 numpy arrays."""
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                w = _permute(w, cfg.num_attention_heads)
            elif gg == "attn_k":
                w = _permute(w, cfg.num_key_value_heads)
            out[f"blk.{i}.{gg}.weight"] = w
    return {k: v.float().contiguous().numpy() for k, v in out.items()}


def _vocab(folder: Path) -> tuple[list[str], list[int], list[str], dict]:
    """(tokens, token types, merges, special ids) from the HF tokenizer files."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    for added in tj.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tj.get("added_tokens", []) if a.get("special")}
    types = [3 if t in special else 1 for t in tokens]  # 3: control, 1: normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    ids = {role: vocab[cfg[f"{role}_token"]] for role in ("bos", "eos", "pad", "unk") if cfg.get(f"{role}_token")}
    return tokens, types, merges, ids


def build(root: Path, variant: str = "", noise: float = 0.0, swap: tuple[int, int] | None = None) -> Path:
    """The tiny model as ``<root>/tiny-llama-gguf/tiny-llama.gguf`` (built once per test run).
    A ``variant`` (its own folder) is the same model with seeded noise of ``noise`` × each
    tensor's spread on its weights (a draft model: same vocabulary, other weights), and/or the
    texts of the two token ids in ``swap`` exchanged (another vocabulary of the same size)."""
    folder, ready = once(root, "tiny-llama-gguf" + (f"-{variant}" if variant else ""))
    path = folder / "tiny-llama.gguf"
    if ready:
        return path
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    hf = build_hf(root)
    cfg = AutoConfig.from_pretrained(hf)
    state = load_file(str(hf / "model.safetensors"))
    tokens, types, merges, ids = _vocab(hf)
    if swap:
        a, b = swap
        tokens[a], tokens[b] = tokens[b], tokens[a]
    folder.mkdir(parents=True, exist_ok=True)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # the GPT-2 split regex, as the ByteLevel pre-tokenizer
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_pad_token_id(ids["pad"])
    w.add_unk_token_id(ids["unk"])
    w.add_add_bos_token(False)
    w.add_chat_template(AutoTokenizer.from_pretrained(hf).chat_template)
    rng = np.random.default_rng(1)
    for name, array in _tensors(state, cfg).items():
        if noise:
            array = (array + rng.normal(0.0, noise * float(array.std()), array.shape)).astype(np.float32)
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    done(folder)
    return path
