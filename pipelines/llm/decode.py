"""The one decode loop, shared by every task and every engine (pipelines/llm/engine.py).

It is hand-rolled rather than a runtime's own ``generate``: it runs in the caller's thread (no
streamer thread that can hang), times the first token exactly, and skips per-token bookkeeping
the tasks do not need. Stop sequences are held back until they cannot match any more, so a stop
string never reaches the user. With a grammar (``Sampling.grammar``: --json-schema) each token is
drawn from those the grammar allows, and the answer ends ("stop") as soon as the grammar is complete.

``engine`` below is any ``LLMEngine``; this module does not import engine.py, which offers the
loop as ``engine.stream(...)`` (importing each other would make a ring).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from taskrun.pipelines.llm.sampling import Sampling, generator, sample
from taskrun.tasks.clock import timed

if TYPE_CHECKING:
    from taskrun.tasks.clock import Clock


@dataclass
class Decoded:
    """What one decode produced, with its timing (seconds; ``first_token_at`` on the job's clock)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"  # stop | length | stop_sequence
    first_token_at: float | None = None  # clock time the first token came out of the model
    prefill_s: float = 0.0  # the forward pass over the prompt (to the first token's logits)
    decode_s: float = 0.0  # from the first token to the last: the model's passes, not the consumer's time
    decode_steps: int = 0  # tokens after the first, the end-of-sequence token included (it cost a pass)
    hit_window: bool = False  # generation stopped because the context window was full
    cached_prompt_tokens: int = 0  # prompt tokens kept from the engine's KV cache, not read again
    draft_tokens: int = 0  # tokens a draft model proposed (speculative decoding)
    accepted_draft_tokens: int = 0  # of them, those the model kept
    draft_stopped_at: int = 0  # output token where the adaptive draft stopped, slower than the model alone (0: never)

    @property
    def decode_tokens_per_s(self) -> float:
        n = self.decode_steps  # tokens after the first, over their time
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


def stream(engine, ids: list[int], s: Sampling, clock: Clock, out: Decoded) -> Iterator[str]:
    """Yield text pieces as they are decoded; fill ``out`` as it goes (its text is final when the
    generator ends)."""
    limit = min(s.max_tokens, engine.context - len(ids))
    emitted = 0
    holdback = max((len(x) for x in s.stop), default=0)
    steps: list[float] = []  # seconds inside the engine and sampler, per token
    rule = _constraint(engine, s) if limit > 0 else None
    for step, token in enumerate(timed(_source(engine, ids, limit, s, rule, out), steps.append)):
        if step == 0:
            out.first_token_at, out.prefill_s = clock.now(), steps[0]
            out.cached_prompt_tokens = engine.cached_tokens  # 0 on an engine without a prompt cache
        else:
            out.decode_s += steps[step]
            out.decode_steps = step
        if token in engine.eos:
            out.finish_reason = "stop"
            break
        out.token_ids.append(token)
        text = engine.decode(out.token_ids)
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
        if rule is not None and rule.done():  # e.g. the JSON object is closed: nothing may follow
            out.finish_reason = "stop"
            break
    else:
        out.finish_reason = "length"
        out.hit_window = limit < s.max_tokens
    out.text = engine.decode(out.token_ids)
    if len(out.text) > emitted:
        yield out.text[emitted:]


def complete(engine, ids: list[int], s: Sampling, clock: Clock) -> Decoded:
    """Decode to the end without streaming (an intermediate answer no one watches)."""
    out = Decoded()
    for _ in stream(engine, ids, s, clock, out):
        pass
    return out


def _constraint(engine, s: Sampling):
    """The grammar this decode is held to (a fresh parser state), or None."""
    if not s.grammar:
        return None
    from taskrun.pipelines.llm.grammar import Constraint

    return Constraint(engine, s.grammar)


def _source(engine, ids: list[int], limit: int, s: Sampling, rule, out: Decoded) -> Iterator[int]:
    """The answer's tokens: drafted and verified (speculative.py) where a draft model is given and
    has room, else one forward pass per token."""
    draft = s.draft
    if draft is not None and rule is None and draft.context >= len(ids) + limit:
        from taskrun.pipelines.llm import speculative

        return speculative.tokens(engine, draft, ids, limit, s, s.draft_tokens, out)
    return _tokens(engine, ids, limit, s, rule)


def _tokens(engine, ids: list[int], limit: int, s: Sampling, rule=None) -> Iterator[int]:
    """Token ids, one per forward pass: prefill, then single-token steps on the KV state; with a
    ``rule`` (grammar.Constraint) each draw is masked by it and advances it."""
    if limit <= 0:
        return
    gen = generator(s.seed) if s.temperature > 0 else None  # greedy draws nothing (and needs no torch)
    try:
        logits = engine.prefill(ids, room=limit)
        history: list[int] = []
        with engine.decoding():
            for i in range(limit):
                token = sample(logits, s, gen, history, rule.allowed() if rule else None)
                history.append(token)
                if rule is not None:
                    rule.advance(token)
                yield token
                if i + 1 < limit:
                    logits = engine.decode_step(token)
    finally:
        engine.free()


def _partial_stop(text: str, stops: tuple[str, ...], holdback: int) -> int:
    """How many trailing characters of ``text`` could be the start of a stop sequence."""
    best = 0
    for x in stops:
        for n in range(min(len(x) - 1, len(text)), 0, -1):
            if text.endswith(x[:n]):
                best = max(best, n)
                break
    return min(best, holdback)
