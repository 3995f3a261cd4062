"""Choosing the next token from an engine's logits: greedy, or temperature → top-k → top-p → a
seeded draw, with a repeat penalty and an optional mask of allowed tokens (a grammar's).

Every engine hands the decode loop its logits as a 1-D float array over the vocabulary: a torch
tensor (transformers) or a numpy array (llama.cpp). Greedy decoding of a numpy array stays in
numpy, so a job on llama.cpp never imports torch (~2 s of a cold start); a seeded draw goes
through torch whatever the engine (numpy's row as a tensor, the same float32 values), so one
sampler serves every runtime and a seed means the same draw whichever engine produced the logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sampling:
    """How one decode chooses its tokens and when it stops."""

    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int = 0
    stop: tuple[str, ...] = ()
    grammar: str = ""  # an llguidance grammar (pipelines/llm/grammar.py): every token is held to it
    repeat_penalty: float = 1.0  # > 1 makes tokens already generated less likely (1 = off)
    # a draft engine for speculative decoding (pipelines/llm/speculative.py), None: off
    draft: object = field(default=None, compare=False, repr=False)
    draft_tokens: int = 0  # tokens the draft proposes per round; 0: adaptive


def generator(seed: int):
    """The random source of one decode: seeded, private to it (the global RNG is left alone)."""
    import torch

    return torch.Generator().manual_seed(seed)


def _greedy_numpy(logits, s: Sampling, history, allowed) -> int:
    """sample()'s greedy choice for a numpy row, in numpy (the same token torch would choose:
    the same float32 operations, and argmax takes the first of equal maxima in both)."""
    import numpy as np

    if s.repeat_penalty != 1.0 and history:
        logits = logits.astype(np.float32, copy=True)
        seen = np.array(sorted(set(history)))
        v = logits[seen]
        logits[seen] = np.where(v > 0, v / np.float32(s.repeat_penalty), v * np.float32(s.repeat_penalty))
    if allowed is not None:
        logits = np.where(np.asarray(allowed), logits, np.float32("-inf"))
    return int(np.argmax(logits))


def sample(logits, s: Sampling, gen, history: list[int] = (), allowed=None) -> int:
    """The next token: greedy at temperature 0, else temperature → top-k → top-p → a seeded draw.

    ``repeat_penalty`` divides the positive logits (multiplies the negative ones) of tokens this
    answer already holds, as llama.cpp and transformers do; small models otherwise fall into loops.
    ``allowed`` (bools over the vocabulary, a tensor or a numpy array) leaves only those tokens
    to draw from. ``gen`` (generator()) is only used, so only needed, at a temperature above 0.
    """
    import numpy as np

    if s.temperature == 0 and isinstance(logits, np.ndarray):  # llama.cpp's row: no torch
        return _greedy_numpy(logits, s, history, allowed)
    import torch

    logits = torch.as_tensor(logits)
    if allowed is not None:
        allowed = torch.as_tensor(allowed)

    if s.repeat_penalty != 1.0 and history:
        logits = logits.float().clone()
        seen = torch.tensor(sorted(set(history)))
        v = logits[seen]
        logits[seen] = torch.where(v > 0, v / s.repeat_penalty, v * s.repeat_penalty)

    if allowed is not None:  # a grammar's next step
        logits = logits.float().masked_fill(~allowed, float("-inf"))
    if s.temperature == 0:
        return int(torch.argmax(logits))
    # from the largest logit down, in float64: a temperature as small as 1e-300 (greedy in all but
    # name) divides to -inf where dividing the logits themselves overflowed to inf - inf = nan
    logits = logits.double()
    logits = ((logits - logits.max()) / s.temperature).float()
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
