"""Causal language models on transformers: loading (GGUF converted once), prompts, and one
streaming decode loop shared by generate and summarize.

The loop is hand-rolled rather than ``model.generate``: it runs in the caller's thread (no
streamer thread that can hang), times the first token exactly, and skips generate()'s per-token
bookkeeping. For Llama-architecture models on CPU the forward pass itself is the lean one in
pipelines/llm/llama_fast.py (fused projections, static KV cache, int8 weights by default); other
models run the transformers module on a growing cache. benchmarks/bench_generate.py measures
each choice; torch.compile was measured too and did not pay (see the benchmark's notes).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Iterator

from taskrun.pipelines import cached_model
from taskrun.pipelines.device import decode_threads, resolve_dtype
from taskrun.tasks.base import ModelCard, TaskError


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int = 0
    stop: tuple[str, ...] = ()
    allowed: object = None  # a bool tensor over the vocabulary: only these tokens may be drawn
    repeat_penalty: float = 1.0  # > 1 makes tokens already generated less likely (1 = off)


@dataclass
class Decoded:
    """What one decode produced, with its timing (seconds since the job's clock started)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"  # stop | length | stop_sequence
    first_token_at: float | None = None  # clock time the first token came out of the model
    prefill_s: float = 0.0  # the forward pass over the prompt (to the first token's logits)
    decode_s: float = 0.0  # from the first token to the last
    decode_steps: int = 0  # tokens after the first, the end-of-sequence token included (it cost a pass)
    hit_window: bool = False  # generation stopped because the context window was full

    @property
    def decode_tokens_per_s(self) -> float:
        n = self.decode_steps  # tokens after the first, over their time
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


class LLM:
    """A loaded causal LM with its tokenizer and the facts the tasks need (window, end tokens)."""

    def __init__(self, model, tokenizer, device: str, dtype_name: str) -> None:
        self.model, self.tok, self.device, self.dtype = model, tokenizer, device, dtype_name
        cfg = model.config
        self.context = int(getattr(cfg, "max_position_embeddings", 0) or tokenizer.model_max_length)
        eos = set()
        for src in (getattr(model, "generation_config", None), cfg, tokenizer):
            v = getattr(src, "eos_token_id", None)
            eos |= set(v) if isinstance(v, (list, tuple)) else ({v} if v is not None else set())
        self.eos = eos
        self.fast = None  # a FastLlama when the architecture allows (pipelines/llm/llama_fast.py)

    # ----------------------------------------------------------------- prompts

    def has_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def prompt_ids(self, text: str, system: str = "", raw: bool = False, prefix: str = "") -> list[int]:
        """Token ids of ``text`` as the model should see it: in its chat template unless ``raw``;
        ``prefix`` starts the assistant's answer (e.g. "{" for JSON)."""
        if raw or not self.has_template():
            body = (system + "\n\n" if system else "") + text + prefix
            return self.tok.encode(body, add_special_tokens=True)
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": text}]
        rendered = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tok.encode(rendered + prefix, add_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False))

    def fit_prompt(self, text: str, budget: int, system: str = "", raw: bool = False,
                   prefix: str = "") -> tuple[list[int], int]:
        """(ids, dropped): the prompt with the end of ``text`` cut so that it takes at most
        ``budget`` tokens; ``dropped`` counts the text tokens removed."""
        ids = self.prompt_ids(text, system, raw, prefix)
        if len(ids) <= budget:
            return ids, 0
        body = self.tok.encode(text, add_special_tokens=False)
        overhead = len(ids) - len(body)
        keep = budget - overhead
        if keep <= 0:
            raise TaskError(f"the template and system prompt alone take {overhead} tokens, more than "
                            f"the {budget} available; shorten --system or lower --max-tokens")
        cut = self.tok.decode(body[:keep])
        ids = self.prompt_ids(cut, system, raw, prefix)
        while len(ids) > budget and keep > 0:  # re-tokenising at the cut can add a token or two
            keep -= max(1, len(ids) - budget)
            ids = self.prompt_ids(self.tok.decode(body[:keep]), system, raw, prefix)
        return ids, len(body) - keep

    # ----------------------------------------------------------------- decoding

    def stream(self, ids: list[int], s: Sampling, clock, out: Decoded) -> Iterator[str]:
        """Yield text pieces as they are decoded; fill ``out`` as it goes (its text is final when
        the generator ends). Stop sequences are held back until they cannot match any more, so a
        stop string never reaches the user."""
        import torch

        limit = min(s.max_tokens, self.context - len(ids))
        gen = torch.Generator().manual_seed(s.seed)
        emitted = 0
        holdback = max((len(x) for x in s.stop), default=0)
        t_start = time.perf_counter()
        for step, token in enumerate(self._tokens(ids, limit, s, gen)):
            now = time.perf_counter()
            if step == 0:
                out.first_token_at = clock.now()
                out.prefill_s = now - t_start
                t_first = now
            else:
                out.decode_s = now - t_first
                out.decode_steps = step
            if token in self.eos:
                out.finish_reason = "stop"
                break
            out.token_ids.append(token)
            text = self.tok.decode(out.token_ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
                continue
            hit = min((i for i in (text.find(x) for x in s.stop) if i >= 0), default=-1)
            if hit >= 0:
                out.text, out.finish_reason = text[:hit], "stop_sequence"
                if hit > emitted:
                    yield text[emitted:hit]
                return
            safe = len(text) - _partial_stop(text, s.stop, holdback)
            out.text = text
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
        else:
            out.finish_reason = "length"
            out.hit_window = limit < s.max_tokens
        out.text = self.tok.decode(out.token_ids, skip_special_tokens=True)
        if len(out.text) > emitted:
            yield out.text[emitted:]

    def score(self, ids: list[int], continuation: list[int]) -> float:
        """Log-probability of ``continuation`` after ``ids`` (to choose among fixed options)."""
        import torch

        if self.fast is not None:
            f = self.fast
            f.reset()
            f.ensure(len(ids) + len(continuation))
            logits, total = f.forward(torch.tensor(ids)), 0.0
            for i, tok in enumerate(continuation):
                total += float(torch.log_softmax(logits.float(), -1)[tok])
                if i + 1 < len(continuation):
                    logits = f.forward(torch.tensor([tok]))
            return total
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids + continuation], device=self.device)).logits[0]
        lp = torch.log_softmax(logits[len(ids) - 1:-1].float(), -1)
        return float(lp[torch.arange(len(continuation)), torch.tensor(continuation)].sum())

    def _tokens(self, ids: list[int], limit: int, s: Sampling, gen) -> Iterator[int]:
        """Token ids, one per forward pass: prefill, then single-token steps on the KV cache."""
        if limit <= 0:
            return
        prefill, step = self._forwards(ids, limit)
        logits = prefill()
        history: list[int] = []
        with decode_threads(self.device):
            for i in range(limit):
                token = sample(logits, s, gen, history)
                history.append(token)
                yield token
                if i + 1 < limit:
                    logits = step(token, len(ids) + i)

    def _forwards(self, ids: list[int], limit: int):
        """(prefill() → last logits, step(token, position) → logits) for this runtime's model:
        the lean Llama pass when there is one, else transformers with a KV cache."""
        import torch

        if self.fast is not None:
            f = self.fast
            f.reset()
            f.ensure(len(ids) + limit)
            return (lambda: f.forward(torch.tensor(ids)),
                    lambda token, pos: f.forward(torch.tensor([token])))
        from transformers import DynamicCache

        dev, cache = self.device, DynamicCache(config=self.model.config)
        model = torch.inference_mode()(self.model)  # no autograd records, even outside the runner

        def prefill():
            pos = torch.arange(len(ids), device=dev)[None]
            return model(input_ids=torch.tensor([ids], device=dev), cache=cache, use_cache=True,
                         position_ids=pos, logits_to_keep=1).logits[0, -1]

        def step(token, pos):
            return model(input_ids=torch.tensor([[token]], device=dev), cache=cache, use_cache=True,
                         position_ids=torch.tensor([[pos]], device=dev)).logits[0, -1]

        return prefill, step


def _partial_stop(text: str, stops: tuple[str, ...], holdback: int) -> int:
    """How many trailing characters of ``text`` could be the start of a stop sequence."""
    best = 0
    for x in stops:
        for n in range(min(len(x) - 1, len(text)), 0, -1):
            if text.endswith(x[:n]):
                best = max(best, n)
                break
    return min(best, holdback)


def sample(logits, s: Sampling, gen, history: list[int] = ()) -> int:
    """The next token: greedy at temperature 0, else temperature → top-k → top-p → a seeded draw.

    ``repeat_penalty`` divides the positive logits (multiplies the negative ones) of tokens this
    answer already holds, as llama.cpp and transformers do; small models otherwise fall into loops.
    """
    import torch

    if s.repeat_penalty != 1.0 and history:
        logits = logits.float().clone()
        seen = torch.tensor(sorted(set(history)))
        v = logits[seen]
        logits[seen] = torch.where(v > 0, v / s.repeat_penalty, v * s.repeat_penalty)

    if s.allowed is not None:  # a constraint (e.g. digits inside a JSON number)
        logits = logits.float().masked_fill(~s.allowed, float("-inf"))
    if s.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits.float() / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sp, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        drop = cum - sp > s.top_p  # keep the smallest set whose mass reaches top_p
        sp = sp.masked_fill(drop, 0.0)
        choice = torch.multinomial(sp / sp.sum(), 1, generator=gen)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=gen))


# --------------------------------------------------------------------------- loading


def load_llm(card: ModelCard, device: str, dtype: str) -> LLM:
    """The model and tokenizer for ``card`` (a GGUF is converted once, then read from the cache).

    On CPU, ``auto`` runs Llama-architecture models on the lean decoder with float16 weights
    (float32 arithmetic; int8 where fbgemm is missing): decoding streams every weight once per
    token, so half the bytes is most of the speed. ``float32`` runs the same decoder unrounded
    (exactly transformers' tokens); ``bfloat16`` casts the weights. TASKRUN_WEIGHTS overrides.
    """
    from taskrun.pipelines.llm.gguf_convert import ensure_converted
    from taskrun.pipelines.llm.llama_fast import FastLlama, compact_weights, supports

    compact = compact_weights() if dtype in ("auto", "", None) and device == "cpu" else None
    compact = os.environ.get("TASKRUN_WEIGHTS", compact or "") or None  # float16 | int8 | float
    torch_dtype, name = resolve_dtype("float32" if compact else dtype, device, auto="float32")

    def factory():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = ensure_converted(card)
        try:
            tok = AutoTokenizer.from_pretrained(str(folder))
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
        except (OSError, ValueError) as exc:
            raise TaskError(f"could not load {card.name} as a causal LM ({exc}); point --model at a "
                            f"Hugging Face folder with config.json and tokenizer files, or a GGUF") from None
        model.to(device).eval()
        llm = LLM(model, tok, device, name)
        if device == "cpu" and supports(model) and os.environ.get("TASKRUN_FAST", "1") != "0":
            import torch

            with torch.inference_mode():
                llm.fast = FastLlama(model, weights=compact or "float", release=True)
            if compact and compact != "float":
                llm.dtype = compact  # the weights' storage while decoding; arithmetic stays float32
        return llm

    key = compact or name
    return cached_model(card, "transformers", device, key, "causal-lm", factory)


def estimate_cost(input_tokens: int, output_tokens: int, price_in: float, price_out: float) -> float | None:
    """Estimated cost in the price's currency, prices per million tokens; None when unpriced."""
    if not price_in and not price_out:
        return None
    return input_tokens * price_in / 1e6 + output_tokens * price_out / 1e6
