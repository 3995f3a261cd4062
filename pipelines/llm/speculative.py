"""Speculative decoding on the llama.cpp engine: a small draft model proposes k tokens, the target
verifies all k in one batched pass (logits for every position), and the answer keeps the target's
distribution exactly (Leviathan et al. 2023, Chen et al. 2023).

Why: a language model on a CPU is bandwidth-bound: one token streams every weight once, and a
pass over k+1 tokens costs little more than a pass over one. The draft costs a fraction of the
target per token, so each accepted draft token is a target pass saved.

The rule, per proposed token x with draft probability q(x) and target probability p(x): greedy
(temperature 0) accepts the longest prefix the target's own argmax agrees with, then adds the
target's token, so the text is token-for-token the target's alone; sampled accepts x with
probability min(1, p(x)/q(x)) and on a rejection draws from max(0, p − q) normalised, so each token
is distributed as the target's. p and q are built with the same settings as the plain path
(repeat penalty, temperature, top-k, top-p: ``probs`` mirrors sampling.sample); the draws come
from a numpy generator seeded with ``--seed`` (the same seed gives the same text, not the plain
path's text: its draws differ).

KV caches: both models hold the context (prompt + answer but its last token) at the start of a
round; the target's verify pass appends the last token and the k proposals, and a rejection cuts
both caches back (``Native.keep``) to the accepted tokens. The draft length adapts: one more after a
round that accepted every proposal, one fewer after a rejection (``--draft-tokens N`` fixes it).

Whether it pays is measured, not assumed: where the CPU is compute-bound (this project's 2-core
hosts: a pass over 4 tokens costs about 3 single steps, and the 0.5B draft's step 0.6 of the 1.5B's),
speculation is slower than the model alone, llama-server's included. So the adaptive mode times
the model's own steps (``PACE_PROBE`` of them first) against the rounds, and stops drafting for
the rest of the answer (``draft_stopped_at``: the output token where it stopped) after a round that
would have been slower even had it kept every proposal, or after ``PACE_ROUNDS`` rounds that made
tokens slower than the model alone. A fixed ``--draft-tokens`` always drafts.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator

import numpy as np

from taskrun.models.gguf import gguf_file, gguf_metadata
from taskrun.pipelines import cached_model
from taskrun.pipelines.llm.llamacpp_native import Native, file_type, library
from taskrun.pipelines.llm.llamacpp_pool import SHARED
from taskrun.pipelines.llm.sampling import Sampling, sample
from taskrun.tasks.base import ModelCard, TaskError

START_K, MIN_K, MAX_K = 4, 1, 12  # the adaptive draft length: where it starts, its bounds
PACE_PROBE, PACE_ROUNDS = 2, 3  # the model's own steps timed first; rounds timed before judging


def draft_name(card: ModelCard, asked: str) -> str:
    """The draft model's name for a job: ``--draft`` (``none``: off), else the model's ``draft`` key."""
    if asked.lower() == "none":
        return ""
    return asked or str(card.extra.get("draft") or "")


def load_draft(name: str, target, explicit: bool, grammar: bool = False):
    """The draft engine for ``target``, checked to share its vocabulary; None where there is none.
    A default draft (models.toml) that cannot serve is quietly off; an asked-for one is an error."""
    if not name:
        return None
    if grammar:
        if explicit:
            raise TaskError("--draft cannot be combined with --json-schema yet; drop one (--draft none)")
        return None
    if getattr(target, "runtime", "") != "llama.cpp":
        if explicit:
            raise TaskError(f"--draft runs on the llama.cpp runtime; this model runs on {target.runtime}")
        return None
    from taskrun.models.resolve import resolve

    card = resolve(name)
    path = gguf_file(card)
    if path is None:
        raise TaskError(f"--draft {name} is not a GGUF file; the draft runs on llama.cpp: give a GGUF model")
    meta = gguf_metadata(path)

    def build():
        lib = library()
        engine = type(target)(lib, Native(lib, path), meta, card.digest)  # LlamaCppEngine (not imported: a cycle)
        engine._copy_wanted = False  # the draft reads prompts on its own weights: no float16 copy
        return engine

    # its own role: a model drafting for itself gets a second context, not the target's KV cache
    draft = cached_model(card, "llama.cpp", "cpu", file_type(meta), "draft", build)
    check_vocab(target, draft, name)
    return draft


def check_vocab(target, draft, name: str) -> None:
    """Refuse a draft whose token ids mean other texts than the target's: its proposals would be
    other words."""
    if target.n_vocab != draft.n_vocab:
        raise TaskError(
            f"--draft {name} has a vocabulary of {draft.n_vocab} tokens, the model {target.n_vocab}: "
            f"a draft must share the model's tokenizer (a smaller model of the same family)"
        )
    a, b = target._pieces(), draft._pieces()
    if a != b:
        i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        raise TaskError(
            f"--draft {name}'s token {i} is {b[i][0]!r}, the model's {a[i][0]!r}: a draft must share "
            f"the model's tokenizer (a smaller model of the same family)"
        )


def eval_all(engine, tokens: list[int]) -> np.ndarray:
    """Append ``tokens`` to ``engine``'s sequence in one llama_decode; the logits after each, one row
    per token (float32, copied)."""
    lib, native, n = engine.lib, engine.native, len(tokens)
    if native.pos + n > native.n_ctx:
        raise TaskError(f"the sequence outgrew its {native.n_ctx}-token KV cache; this is a bug (report it)")
    batch = lib.llama_batch_init(n, 0, 1)
    try:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, native.pos + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, 1
        batch.n_tokens = n
        with SHARED.on(lib, native.ctx, single=True):
            rc = lib.llama_decode(native.ctx, batch)
    finally:
        lib.llama_batch_free(batch)
    if rc != 0:
        native.clear()
        raise TaskError(f"llama.cpp failed to verify {n} draft tokens (llama_decode returned {rc})")
    native.tokens.extend(tokens)
    out = np.empty((n, engine.n_vocab), dtype=np.float32)
    ctypes.memmove(out.ctypes.data, lib.llama_get_logits(native.ctx), out.nbytes)
    return out


def probs(logits: np.ndarray, s: Sampling, history: list[int]) -> np.ndarray:
    """The distribution sampling.sample draws from: repeat penalty → temperature → top-k → top-p."""
    x = logits.astype(np.float64, copy=True)
    if s.repeat_penalty != 1.0 and history:
        seen = np.array(sorted(set(history)))
        v = x[seen]
        x[seen] = np.where(v > 0, v / s.repeat_penalty, v * s.repeat_penalty)
    with np.errstate(over="ignore"):  # as sampling.sample: from the top down, a tiny temperature sends
        x = (x - x.max()) / s.temperature  # the others to -inf (greedy), never the top to inf - inf = nan
    if s.top_k and s.top_k < x.shape[-1]:
        kth = np.partition(x, -s.top_k)[-s.top_k]
        x[x < kth] = -np.inf
    p = np.exp(x - x.max())
    p /= p.sum()
    if s.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        sp = p[order]
        drop = np.cumsum(sp) - sp > s.top_p
        p[order[drop]] = 0.0
        p /= p.sum()
    return p


class Stats:
    """What the draft did in one decode: tokens proposed, of them accepted, and the output token
    where drafting stopped because it was slower (0: never; decode.Decoded has the same fields and
    is passed in its place)."""

    def __init__(self) -> None:
        self.draft_tokens = self.accepted_draft_tokens = self.draft_stopped_at = 0


class _Pace:
    """Seconds per output token of the model's own steps and of the propose-verify rounds, in one
    answer: drafting goes on while the rounds are the faster (``drafting``)."""

    def __init__(self, exact: int) -> None:
        self.plain_s = self.round_s = 0.0
        self.plain_n = self.round_n = self.rounds = 0
        self.off = False
        self.exact = exact  # the model's cache positions written as the model alone writes them

    def drafting(self) -> bool:
        return self.plain_n >= PACE_PROBE and not self.off

    def plain(self, seconds: float) -> None:
        self.plain_s, self.plain_n = self.plain_s + seconds, self.plain_n + 1

    def round(self, seconds: float, made: int, proposed: int) -> None:
        """A round took ``seconds`` for ``made`` tokens of ``proposed`` + 1 it could have made: off
        at once if even that many would be slower than the model alone (a round costs about the
        same whatever it accepts), else once PACE_ROUNDS rounds were slower."""
        self.round_s, self.round_n, self.rounds = self.round_s + seconds, self.round_n + made, self.rounds + 1
        plain = self.plain_s / self.plain_n
        if seconds / (proposed + 1) > plain or (self.rounds >= PACE_ROUNDS and self.round_s / self.round_n > plain):
            self.off = True


class _Pick:
    """One decode's token choice from logits: the target's greedy rule, or a seeded draw."""

    def __init__(self, s: Sampling) -> None:
        self.s, self.rng = s, np.random.default_rng(s.seed) if s.temperature > 0 else None

    def draw(self, logits, history: list[int]) -> tuple[int, np.ndarray | None]:
        if self.rng is None:
            return sample(logits, self.s, None, history), None
        p = probs(logits, self.s, history)
        return int(self.rng.choice(p.shape[0], p=p)), p

    def judge(self, rows: np.ndarray, props: list[int], qs: list, history: list[int]) -> tuple[int, int]:
        """(accepted, next token): how many proposals the target keeps, and the token after them
        (a corrected one at a rejection, the bonus one after a full acceptance)."""
        for j, x in enumerate(props):
            seen = history + props[:j]
            if self.rng is None:
                y = sample(rows[j], self.s, None, seen)
                if y != x:
                    return j, y
                continue
            p, q = probs(rows[j], self.s, seen), qs[j]
            if self.rng.random() * q[x] < p[x]:  # accept with probability min(1, p/q)
                continue
            rest = np.maximum(p - q, 0.0)
            total = rest.sum()
            rest = rest / total if total > 0 else p
            return j, int(self.rng.choice(rest.shape[0], p=rest))
        return len(props), self.draw(rows[len(props)], history + props)[0]


def tokens(target, draft, ids: list[int], limit: int, s: Sampling, fixed_k: int, stats) -> Iterator[int]:
    """The answer's token ids as decode._tokens yields them, the draft proposing and the target
    verifying; ``fixed_k`` 0 adapts the draft length."""
    if limit <= 0:
        return
    pick, k = _Pick(s), fixed_k or START_K
    pace = None if fixed_k else _Pace(len(ids))
    try:
        t_logits = target.prefill(ids, room=limit + 1)
        draft.prefill(ids, room=limit + 1)
        history: list[int] = []
        with target.decoding(), draft.decoding():
            y = pick.draw(t_logits, history)[0]
            while True:
                history.append(y)
                yield y
                if len(history) >= limit or y in target.eos:
                    return
                if pace is not None and not pace.drafting():  # timing the model alone, or stopped
                    stats.draft_stopped_at = stats.draft_stopped_at or (len(history) if pace.off else 0)
                    y = _plain(target, ids, history, pick, pace)
                    continue
                n, t0, asked = len(history), time.perf_counter(), stats.draft_tokens
                accepted, y = _round(target, draft, ids, history, min(k, limit - n), pick, stats)
                if pace is not None:
                    pace.round(time.perf_counter() - t0, len(history) - n + 1, stats.draft_tokens - asked)
                for x in history[n:]:
                    yield x
                    if x in target.eos:
                        return
                if len(history) >= limit:
                    return
                if not fixed_k:
                    k = min(MAX_K, k + 1) if accepted == k else max(MIN_K, k - 1)
    finally:
        target.free()
        draft.free()


def _plain(target, ids, history, pick, pace) -> int:
    """One step of the model alone after ``history`` → the next token; the step's time goes to
    ``pace``. After rounds, the tokens they added are read again one by one first: a batched
    verify pass rounds its cache entries unlike single steps (llama.cpp's repacked kernels), and
    from here on the answer is the model's alone, token for token."""
    t0 = time.perf_counter()
    fed = ids + history
    if len(target.native.tokens) == pace.exact == len(fed) - 1:
        keep = pace.exact  # the last step was the model's own: nothing to read again
    else:
        keep = min(pace.exact, _shared(target.native.tokens, fed))
    if not target.native.keep(keep):
        raise TaskError("llama.cpp could not cut the KV cache back after a rejected draft")
    for token in fed[keep:]:
        logits = target.decode_step(token)
    pace.exact = len(fed)
    y = pick.draw(logits, history)[0]
    pace.plain(time.perf_counter() - t0)
    return y


def _round(target, draft, ids, history, k, pick, stats) -> tuple[int, int]:
    """One propose-verify round after ``history`` (its last token not yet in either cache): the
    accepted proposals are appended to ``history``; returns (how many, the target's next token)."""
    ctx = ids + history[:-1]
    base = len(ctx)
    for engine in (target, draft):  # both caches back to the context (a rejection's tail cut)
        if not engine.native.keep(min(base, _shared(engine.native.tokens, ctx))):
            raise TaskError("llama.cpp could not cut the KV cache back after a rejected draft")
    missing = ctx[draft.native.pos :] + [history[-1]]
    arr = (draft.lib.llama_token * len(missing))(*missing)
    d_logits = draft._logits(draft.native.eval(arr, len(missing)))
    props: list[int] = []
    qs: list = []
    for j in range(k):
        x, q = pick.draw(d_logits, history + props)
        props.append(x)
        qs.append(q)
        if x in target.eos or j + 1 == k:
            break
        d_logits = draft.decode_step(x)
    rows = eval_all(target, [*ctx[target.native.pos :], history[-1], *props])[-len(props) - 1 :]
    accepted, y = pick.judge(rows, props, qs, history)
    stats.draft_tokens += len(props)
    stats.accepted_draft_tokens += accepted
    history.extend(props[:accepted])
    return accepted, y


def _shared(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
