"""The transformers LLM engine: a causal LM and its tokenizer (a GGUF is converted once).

For Llama-architecture models on CPU the forward pass is the lean one in
pipelines/llm/llama_fast.py (fused projections, static KV cache, float16 or int8 weights by
default); other models run the transformers module on a growing cache. benchmarks/bench_generate.py
measures each choice; torch.compile was measured too and did not pay (see the benchmark's notes).
"""

from __future__ import annotations

import os

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import decode_threads, resolve_device, resolve_dtype, transpose_head
from taskrun.pipelines.llm.engine import LLMEngine
from taskrun.tasks.base import ModelCard, TaskError

PREFILL_CHUNK = 512  # prompt tokens per forward pass while reading a prompt (see prefill)


class TransformersLLM(LLMEngine):
    """A loaded transformers causal LM; ``fast`` is its lean FastLlama pass when it has one."""

    runtime = "transformers"

    def __init__(self, model, tokenizer, device: str, dtype_name: str) -> None:
        import torch

        self.model, self.tok, self.device, self.dtype = model, tokenizer, device, dtype_name
        cfg = model.config
        self.context = int(getattr(cfg, "max_position_embeddings", 0) or tokenizer.model_max_length)
        eos = set()
        for src in (getattr(model, "generation_config", None), cfg, tokenizer):
            v = getattr(src, "eos_token_id", None)
            eos |= set(v) if isinstance(v, (list, tuple)) else ({v} if v is not None else set())
        self.eos = eos
        self.fast = None  # a FastLlama when the architecture allows (pipelines/llm/llama_fast.py)
        self._infer = torch.inference_mode()(model)  # no autograd records, even outside the runner
        self._cache, self._pos = None, 0  # the module's KV cache and the next position
        self._texts: list[str] | None = None

    @classmethod
    def load(cls, card: ModelCard, device: str, dtype: str) -> TransformersLLM:
        """The model and tokenizer for ``card`` (a GGUF is converted once, then read from the cache).

        On CPU, ``auto`` runs Llama-architecture models on the lean decoder with float16 weights
        (float32 arithmetic; int8 where fbgemm is missing): decoding streams every weight once per
        token, so half the bytes is most of the speed. ``float32`` runs the same decoder unrounded
        (exactly transformers' tokens); ``bfloat16`` casts the weights. TASKRUN_WEIGHTS overrides.
        """
        from taskrun.pipelines.llm.llama_fast import compact_weights

        device = resolve_device(device)
        compact = compact_weights() if dtype in ("auto", "", None) and device == "cpu" else None
        compact = os.environ.get("TASKRUN_WEIGHTS", compact or "") or None  # float16 | int8 | float
        torch_dtype, name = resolve_dtype("float32" if compact else dtype, device, auto="float32")
        return cached_model(
            card,
            "transformers",
            device,
            compact or name,
            "causal-lm",
            lambda: cls._build(card, device, torch_dtype, name, compact),
        )

    @classmethod
    def _build(cls, card: ModelCard, device: str, torch_dtype, name: str, compact: str | None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from taskrun.pipelines.llm.gguf_convert import ensure_converted
        from taskrun.pipelines.llm.llama_fast import FastLlama, supports

        folder = ensure_converted(card)
        try:
            tok = AutoTokenizer.from_pretrained(str(folder))
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
        except (OSError, ValueError) as exc:
            raise TaskError(
                f"could not load {card.name} as a causal LM ({exc}); point --model at a "
                f"Hugging Face folder with config.json and tokenizer files, or a GGUF"
            ) from None
        model.to(device).eval()
        fast = device == "cpu" and supports(model) and os.environ.get("TASKRUN_FAST", "1") != "0"
        if device == "cpu" and name == "float32" and not (fast and compact not in (None, "float")):
            # the vocabulary head in the layout MKL reads fastest, wherever float32 products
            # compute it (the lean pass with float16 or int8 weights packs its own)
            transpose_head(model)
        llm = cls(model, tok, device, name)
        if fast:
            import torch

            with torch.inference_mode():
                llm.fast = FastLlama(model, weights=compact or "float", release=True)
            if compact and compact != "float":
                llm.dtype = compact  # the weights' storage while decoding; arithmetic stays float32
        return llm

    # ----------------------------------------------------------------- text ↔ tokens

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special)

    def prompt_ids(
        self, text: str, system: str = "", raw: bool = False, prefix: str = "", history: tuple = ()
    ) -> list[int]:
        if raw or not getattr(self.tok, "chat_template", None):
            turns = "".join(f"{said}\n\n" for _, said in history)  # no template: the turns as text
            body = (system + "\n\n" if system else "") + turns + text + prefix
            return self.tok.encode(body, add_special_tokens=True)
        messages = (
            ([{"role": "system", "content": system}] if system else [])
            + [{"role": role, "content": said} for role, said in history]
            + [{"role": "user", "content": text}]
        )
        rendered = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tok.encode(rendered + prefix, add_special_tokens=False)

    def token_texts(self) -> list[str]:
        if self._texts is None:
            tok, width = self.tok, self.model.config.vocab_size  # the logits' width
            pieces = tok.convert_ids_to_tokens(list(range(min(len(tok), width))))
            texts = [tok.convert_tokens_to_string([p]) if p else "" for p in pieces]
            self._texts = texts + [""] * (width - len(texts))
        return self._texts

    def token_bytes(self) -> list[bytes]:
        """Exact bytes per token (byte-level BPE pieces of half a character included), read by
        llguidance from the fast tokenizer's own definition; a slow tokenizer gets the default."""
        from transformers import PreTrainedTokenizerFast

        if not isinstance(self.tok, PreTrainedTokenizerFast):
            return super().token_bytes()
        from llguidance.hf import from_tokenizer

        width = self.model.config.vocab_size
        lt = from_tokenizer(self.tok, n_vocab=max(width, len(self.tok)))
        return [(b"\xff" if lt.is_special_token(i) else b"") + lt.decode_bytes([i]) for i in range(width)]

    # ----------------------------------------------------------------- forward passes

    def prefill(self, ids: list[int], room: int = 0):
        """Read the prompt PREFILL_CHUNK tokens at a time: attention over a whole prompt at once
        holds heads × n × n scores (a 7k-token prompt took 6.4 GB); in chunks it holds
        heads × chunk × n, and the KV cache is the same."""
        import torch

        step = PREFILL_CHUNK
        if self.fast is not None:
            f = self.fast
            f.reset()
            f.ensure(len(ids) + room)
            t = torch.tensor(ids)
            for a in range(0, len(ids), step):
                logits = f.forward(t[a : a + step])
            return logits
        from transformers import DynamicCache

        dev = self.device
        self._cache, self._pos = DynamicCache(config=self.model.config), len(ids)
        for a in range(0, len(ids), step):
            part = ids[a : a + step]
            pos = torch.arange(a, a + len(part), device=dev)[None]
            logits = self._infer(
                input_ids=torch.tensor([part], device=dev),
                cache=self._cache,
                use_cache=True,
                position_ids=pos,
                logits_to_keep=1,
            ).logits[0, -1]
        return logits

    def decode_step(self, token: int):
        import torch

        if self.fast is not None:
            return self.fast.forward(torch.tensor([token]))
        dev, pos = self.device, self._pos
        self._pos += 1
        return self._infer(
            input_ids=torch.tensor([[token]], device=dev),
            cache=self._cache,
            use_cache=True,
            position_ids=torch.tensor([[pos]], device=dev),
        ).logits[0, -1]

    def free(self) -> None:
        self._cache, self._pos = None, 0
        if self.fast is not None:
            self.fast.reset()

    def decoding(self):
        return decode_threads(self.device)

    def score(self, ids: list[int], continuation: list[int]) -> float:
        if self.fast is not None:  # the lean pass appends token by token
            return super().score(ids, continuation)
        import torch

        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids + continuation], device=self.device)).logits[0]
        lp = torch.log_softmax(logits[len(ids) - 1 : -1].float(), -1)
        return float(lp[torch.arange(len(continuation)), torch.tensor(continuation)].sum())
