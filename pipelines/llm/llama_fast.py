"""A lean forward pass for Llama-architecture models (SmolLM2, Llama, Mistral without sliding
window), used by the transformers engine (pipelines/llm/hf_engine.py) instead of the transformers
module.

Why: decoding one token of a small model is a few dozen small matrix-vector products; in the
transformers module most of each token's time goes to framework work around them (mask building,
cache objects, hooks, per-call kwargs). Here each layer is ~20 tensor ops on preallocated buffers:
q/k/v and gate/up projections fused into one matrix each, a static KV cache indexed in place,
rotary tables computed once. The weights are the model's own (shared, not copied, where they are
not fused); the math is the same as transformers' LlamaDecoderLayer, which a test checks token for
token against ``model(...)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def supports(model) -> bool:
    """True for the plain Llama architecture this module reimplements exactly."""
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return (
        cfg.model_type in ("llama", "mistral")
        and getattr(cfg, "hidden_act", "silu") == "silu"
        and not getattr(cfg, "attention_bias", False)
        and not getattr(cfg, "mlp_bias", False)
        and getattr(cfg, "sliding_window", None) is None
        and rope.get("rope_type", "default") == "default"
        and getattr(cfg, "pretraining_tp", 1) == 1
    )


REDUCE_RANGE = True  # 7-bit activations: fbgemm's int8 kernels saturate with 8 (garbage text)


def int8_linear(w: torch.Tensor):
    """y = x @ w.T with w stored as int8 per output channel (fbgemm, activations quantised per call).

    Decoding reads every weight once per token, so it is bound by memory traffic: int8 weights
    move a quarter of float32's bytes. The model ships as a 4-bit GGUF (Q4_1), so an 8-bit
    per-channel copy of its dequantised weights keeps more precision than the file has.
    """
    w = w.detach().float().contiguous()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12).double()
    q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(q, None)
    op = torch.ops.quantized.linear_dynamic
    return lambda x: op(x, packed, REDUCE_RANGE)


def int8_weight_only_linear(w: torch.Tensor):
    """y = x @ w.T with w stored as int8 per output channel and activations kept in bfloat16.

    Only the weights are rounded (a quarter of float32's bytes to stream per token). Measured on
    SmolLM2-135M: the top-1 next token agrees with float32 at 97% of the positions of a text,
    against 89% for fbgemm's dynamic int8 (which also rounds the activations to 7 bits).
    """
    w = w.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
    q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
    s16 = scale.to(torch.bfloat16)
    mm = torch._weight_int8pack_mm
    # The bfloat16 output is not cast back: the next op (a float32 residual add, the rotary
    # tables, the KV cache write) promotes it anyway, and a cast per product costs an op.
    return lambda x: mm(x.to(torch.bfloat16), q, s16)


def float_linear(w: torch.Tensor):
    return lambda x: F.linear(x, w)


def bf16_linear(w: torch.Tensor):
    """For the prompt (many rows at once), where compute, not bytes, is the limit: bfloat16
    matrix products ran 3.4x faster than float32 here, int8 weight-only ones slower than float32."""
    wb = w.detach().to(torch.bfloat16).contiguous()
    return lambda x: F.linear(x.to(torch.bfloat16), wb).to(x.dtype)


def fp16_linear(w: torch.Tensor):
    """y = x @ w.T with w stored in float16 and float32 arithmetic (fbgemm's packed fp16 GEMV).

    Half of float32's bytes per token, and float16 keeps 11 bits of mantissa, so the weights of
    a Q4_1 GGUF come through all but unchanged. Measured here, one pass over SmolLM2's weights:
    13 ms (20 GB/s) against 18 ms for int8 weight-only (7.5 GB/s) and 44 ms for float32.
    """
    packed = torch.ops.quantized.linear_prepack_fp16(w.detach().float().contiguous(), None)
    op = torch.ops.quantized.linear_dynamic_fp16
    return lambda x: op(x, packed)


LINEARS = {"float": float_linear, "float16": fp16_linear, "int8": int8_weight_only_linear, "int8-dynamic": int8_linear}
BYTES = {"float16": 2, "int8": 1, "int8-dynamic": 1}  # per weight, for the decode ceiling


def compact_weights() -> str | None:
    """The fastest weight format this torch build has for CPU decoding, or None."""
    if "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic_fp16"):
        return "float16"
    if hasattr(torch, "_weight_int8pack_mm"):
        return "int8"
    return None


def _layer(norms, ws, lin):
    (w_in, w_post), (wqkv, wo, wgu, wdown) = norms, ws
    return (w_in, lin(wqkv), lin(wo), w_post, lin(wgu), lin(wdown))


class FastLlama:
    def __init__(self, model, max_len: int = 512, weights: str = "float", release: bool = False) -> None:
        """``release`` frees the transformers module's projection weights as they are repacked
        (the module can no longer run afterwards), so memory holds one copy, not two."""
        cfg = model.config
        inner = model.model
        self.dtype = inner.embed_tokens.weight.dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        lin = LINEARS[weights]
        self.weights = weights
        head = model.get_output_embeddings()  # already transposed in float32 (pipelines/device.py: transpose_head)
        self.lm_head = (lambda x, w_t=head.w_t: x @ w_t) if hasattr(head, "w_t") else lin(head.weight)
        self.layers = []  # decoding one token: matrix-vector products, bound by bytes
        self.prompt_layers = []  # reading the prompt: matrix products, bound by compute
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous()
            wgu = torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous()
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            ws = (wqkv, a.o_proj.weight, wgu, m.down_proj.weight)
            self.layers.append(_layer(norms, ws, lin))
            if weights != "float":
                self.prompt_layers.append(_layer(norms, ws, bf16_linear))
            if release:  # the module's own copies are dead weight now: free them layer by layer
                for mod in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj) + (
                    (a.o_proj, m.down_proj) if weights != "float" else ()
                ):
                    mod.weight = torch.nn.Parameter(torch.empty(0, dtype=mod.weight.dtype), requires_grad=False)
        self.prompt_layers = self.prompt_layers or self.layers
        self.scale = self.head_dim**-0.5
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv * self.head_dim
        self.ffn = cfg.intermediate_size
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self.n_layers = len(self.layers)
        self.max_len = 0
        self.pos = 0
        self.ensure(max_len)

    def ensure(self, length: int) -> None:
        """Room for ``length`` tokens: rotary tables and KV cache grow (by powers of two) on demand,
        so a short job never allocates the whole window's cache."""
        if length <= self.max_len:
            return
        size = 1 << max(9, (length - 1).bit_length())
        freqs = torch.outer(torch.arange(size, dtype=torch.float32), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * self.rope_scale).to(self.dtype)
        self.sin = (emb.sin() * self.rope_scale).to(self.dtype)
        k = torch.zeros(self.n_layers, self.n_kv, size, self.head_dim, dtype=self.dtype)
        v = torch.zeros_like(k)
        if self.pos:
            k[:, :, : self.pos] = self.k[:, :, : self.pos]
            v[:, :, : self.pos] = self.v[:, :, : self.pos]
        self.k, self.v, self.max_len = k, v, size

    def _rms(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(self.dtype)

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the last position after appending ``ids`` (1-D) at the current position."""
        t = ids.shape[0]
        p0, p1 = self.pos, self.pos + t
        self.ensure(p1)
        x = F.embedding(ids, self.embed)  # [t, hidden]
        cos = self.cos[p0:p1].unsqueeze(0)  # [1, t, d], broadcast over heads
        sin = self.sin[p0:p1].unsqueeze(0)
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        causal = t > 1
        for i, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(self.prompt_layers if t > 1 else self.layers):
            h = self._rms(x, w_in)
            qkv = wqkv(h)
            # q and k sit side by side in the fused output: one rotary pass covers both heads' sets
            qk = self._rope(qkv[:, : self.q_size + self.kv_size].view(t, nh + nkv, d).transpose(0, 1), cos, sin)
            q = qk[:nh]
            self.k[i, :, p0:p1] = qk[nh:]
            self.v[i, :, p0:p1] = qkv[:, self.q_size + self.kv_size :].view(t, nkv, d).transpose(0, 1)
            kc, vc = self.k[i, :, :p1], self.v[i, :, :p1]
            # Batched (4-D) inputs: torch's CPU flash kernel takes them and holds a tile of the
            # scores at a time; 3-D ones fall back to the math path, which holds heads x t x p1
            # floats (1.8 GB per layer for a 7k-token prompt). Measured for a 512-token chunk
            # after 6.5k tokens: 0.29 s and 0.3 GB peak against 0.89 s and 0.6 GB.
            if causal and p0 == 0:
                att = F.scaled_dot_product_attention(q[None], kc[None], vc[None], is_causal=True, enable_gqa=True)[0]
            elif causal:  # a multi-token append after earlier tokens (a prompt's later chunk)
                mask = torch.ones(t, p1, dtype=torch.bool).tril(p0)
                att = F.scaled_dot_product_attention(q[None], kc[None], vc[None], attn_mask=mask, enable_gqa=True)[0]
            else:  # one new token: grouped-query attention as two small products
                # (SDPA's CPU path for grouped heads copies the cache per query group first)
                g = nh // nkv
                w = torch.softmax(torch.matmul(q.view(nkv, g, d), kc.transpose(1, 2)) * self.scale, dim=-1)
                x = x + wo(torch.matmul(w, vc).view(1, nh * d))
                h = self._rms(x, w_post)
                gu = wgu(h)
                x = x + wdown(F.silu(gu[:, : self.ffn]) * gu[:, self.ffn :])
                continue
            x = x + wo(att.transpose(0, 1).reshape(t, nh * d))
            h = self._rms(x, w_post)
            gu = wgu(h)
            x = x + wdown(F.silu(gu[:, : self.ffn]) * gu[:, self.ffn :])
        self.pos = p1
        return self.lm_head(self._rms(x[-1:], self.norm))[0].float()

    def reset(self) -> None:
        self.pos = 0  # old entries beyond pos are never read: attention stops at pos
