"""Decoding held to a grammar: the answer to --json-schema is valid JSON for the schema by
construction, on every engine.

The grammar engine is llguidance (guidance-ai/llguidance, the one llama.cpp itself links for its
``--json-schema``): it compiles a JSON Schema to a grammar (tasks/generate.py ``schema_grammar``)
and, at each step, computes which tokens of the vocabulary may come next. Chosen over xgrammar
(whose wheel pulls triton, a GPU compiler) and outlines-core (a regex per schema: no recursion,
fewer keywords): one 3 MB wheel with no dependencies, JSON Schema with $ref, anyOf/oneOf, enums,
string lengths and patterns, and a mask in well under a millisecond per token.

The grammar sees a model through its vocabulary only: the bytes of each token id
(``LLMEngine.token_bytes``), its end-of-sequence ids and its ``encode``, so an engine needs
nothing grammar-specific. The decode loop (pipelines/llm/decode.py) asks ``allowed()`` before
each draw, ``advance(token)`` after it, and stops when ``done()``.
"""

from __future__ import annotations

import weakref

from taskrun.tasks.base import TaskError

_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine → its LLTokenizer


class _Vocabulary:
    """An engine's vocabulary in the shape llguidance's ``TokenizerWrapper`` reads."""

    def __init__(self, engine) -> None:
        self.tokens = engine.token_bytes()
        self.eos_token_id = min(engine.eos) if engine.eos else None
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(self.tokens) if b.startswith(b"\xff")]
        self._encode = engine.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


def tokenizer(engine):
    """llguidance's view of ``engine``'s vocabulary, built once per loaded engine (it walks
    every token: ~0.1 s for a 49k vocabulary). A batched sequence (llamacpp_batch.Sequence) uses
    its loaded engine's."""
    engine = getattr(engine, "base", engine)
    if engine not in _TOKENIZERS:
        from llguidance import LLTokenizer, TokenizerWrapper

        vocab = _Vocabulary(engine)
        _TOKENIZERS[engine] = LLTokenizer(
            TokenizerWrapper(vocab), n_vocab=len(vocab.tokens), eos_token=sorted(engine.eos)
        )
    return _TOKENIZERS[engine]


class Constraint:
    """One decode's progress through a grammar: which tokens may come next, and when the text is
    complete. Fresh for every answer (it holds the parser's state)."""

    def __init__(self, engine, grammar: str) -> None:
        from llguidance import LLMatcher

        self.tok = tokenizer(engine)
        self.matcher = LLMatcher(self.tok, grammar, log_level=0)
        self._check()

    def allowed(self):
        """A bool numpy array over the vocabulary: True where the token keeps the text in the
        grammar (end-of-sequence ids only where the text is complete)."""
        import numpy as np

        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        self._check()
        flags = np.unpackbits(bits, bitorder="little")[: self.tok.vocab_size].astype(bool)
        if not flags.any():
            raise TaskError(
                "the grammar allows no token here: the model's vocabulary cannot "
                "write what the schema requires; simplify the schema"
            )
        return flags

    def advance(self, token: int) -> None:
        """Move past the drawn ``token`` (one ``allowed()`` permitted)."""
        self.matcher.consume_token(token)
        self._check()

    def done(self) -> bool:
        """True when the text is complete and nothing more may follow (a JSON object closed)."""
        return self.matcher.is_stopped()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise TaskError(
                f"the JSON grammar failed: {self.matcher.get_error()}; "
                f"simplify the schema (fewer alternatives, shorter patterns)"
            )
