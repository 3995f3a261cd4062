"""The LLM engine interface: what generate and summarize need from a runtime that runs a causal
language model, and nothing more.

An engine is a loaded model with its tokenizer, driven one forward pass at a time: ``prefill``
reads a prompt into a fresh KV state and returns the logits of its last position; ``decode_step``
appends one token and returns the next logits; ``free`` drops the KV state. The decode loop
(pipelines/llm/decode.py: sampling, stop sequences, timing) and the task logic (generate.py,
summarize.py, schema.py) are written once above it. Logits are 1-D float arrays over the
vocabulary, torch tensors or numpy arrays (llama.cpp's, so that its jobs never import torch), and
one sampler (pipelines/llm/sampling.py) serves every engine.

Adding a runtime (llama.cpp, ONNX Runtime, ...) is one module with a subclass of ``LLMEngine``
and its rows in the RUNTIMES table of pipelines/__init__.py, e.g.

    ("generate", "llama.cpp"): Runtime(_P + "llm.generate:GeneratePipeline",
                                       engine=_P + "llm.llamacpp:LlamaCppEngine"),
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskrun.pipelines.llm.decode import Decoded
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.tasks.base import ModelCard
    from taskrun.tasks.clock import Clock


class LLMEngine(ABC):
    """A loaded causal LM. One engine holds one KV state: it decodes one sequence at a time.

    The facts below are set when it loads; the tasks and the run log read them.
    """

    runtime: str = ""  # the runtime's name, as in the RUNTIMES table and the run log
    device: str  # where it runs ("cpu", "cuda", ...)
    dtype: str  # what the run log records: the weights' storage while decoding ("float16", "int8", ...)
    context: int  # the window in tokens: prompt and answer together
    eos: set[int]  # token ids that end an answer (end of text, end of turn)
    cached_tokens: int = 0  # prompt tokens the last prefill kept from an earlier sequence's KV state

    @classmethod
    @abstractmethod
    def load(cls, card: ModelCard, device: str, dtype: str) -> LLMEngine:
        """The engine for ``card`` on ``device`` ("auto" included: the engine resolves it); ``dtype`` is the user's choice ("auto"
        lets the engine pick its measured best). Loaded once per (model, runtime, device, dtype)
        through ``taskrun.pipelines.cached_model``. A model this runtime cannot load is a TaskError."""

    # ----------------------------------------------------------------- text ↔ tokens

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` alone, with no special tokens added."""

    @abstractmethod
    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """The text of ``ids``; special tokens (end of turn, ...) are left out unless ``skip_special``
        is False (to cut a user's text that contains them without losing them)."""

    @abstractmethod
    def prompt_ids(
        self, text: str, system: str = "", raw: bool = False, prefix: str = "", history: tuple = ()
    ) -> list[int]:
        """Token ids of ``text`` as the model should see it: in its chat template (with ``system``
        as the system message, after the earlier turns of ``history``, (role, text) pairs)
        unless ``raw`` or the model has none; ``prefix`` starts the assistant's answer (e.g. "{"
        for JSON)."""

    @abstractmethod
    def token_texts(self) -> list[str]:
        """The text of each token id on its own, one entry per logit ("" for tokens with no text):
        what ``token_bytes`` is built from unless the engine knows better. May be slow: cache it."""

    def token_bytes(self) -> list[bytes]:
        """The bytes of each token id on its own, one entry per logit: what a grammar
        (pipelines/llm/grammar.py, --json-schema) matches tokens against. A special token (end of
        turn, ...) starts with b"\\xff" so that no text matches it; b"" marks a token a grammar
        never allows. Called once per loaded engine.

        This default is built from ``token_texts()``: exact for tokens that are whole characters;
        one holding part of a multi-byte character (its text has "\\ufffd") is left out; a token
        that ``decode`` drops (skipping special tokens) is special. An engine that can read its
        tokens' bytes (transformers, llama.cpp's ``llama_token_to_piece``) returns them exactly."""

        def piece(i: int, text: str) -> bytes:
            if not text or "\ufffd" in text:
                return b""
            special = i in self.eos or not self.decode([i])
            return (b"\xff" if special else b"") + text.encode()

        return [piece(i, t) for i, t in enumerate(self.token_texts())]

    def count(self, text: str) -> int:
        """How many tokens ``text`` takes."""
        return len(self.encode(text))

    # ----------------------------------------------------------------- forward passes

    @abstractmethod
    def prefill(self, ids: list[int], room: int = 0):
        """Start the sequence ``ids`` and return the logits of its last position. ``room`` is how
        many tokens may follow, so a KV cache can be sized once. An engine with a prompt cache
        (llama.cpp) keeps the KV of the prefix it shares with the previous sequence and says how
        many tokens in ``cached_tokens``."""

    @abstractmethod
    def decode_step(self, token: int):
        """Append ``token`` to the sequence and return the logits of the next position."""

    @abstractmethod
    def free(self) -> None:
        """The decode loop calls it when a sequence ends: drop its KV state, or keep it for the
        next prompt's shared prefix (llama.cpp's prompt cache)."""

    def decoding(self) -> AbstractContextManager:
        """Entered around the token-by-token loop (after the prefill): e.g. the thread setting that
        suits single-token steps. Nothing by default."""
        return nullcontext()

    def score(self, ids: list[int], continuation: list[int]) -> float:
        """Log-probability of ``continuation`` after ``ids`` (to choose among fixed options).
        This default feeds it token by token; an engine may do it in one pass."""
        import torch

        logits, total = self.prefill(ids, room=len(continuation)), 0.0
        try:
            for i, tok in enumerate(continuation):
                total += float(torch.log_softmax(torch.as_tensor(logits).float(), -1)[tok])
                if i + 1 < len(continuation):
                    logits = self.decode_step(tok)
        finally:
            self.free()
        return total

    # ----------------------------------------------------------------- the shared loop

    def stream(self, ids: list[int], sampling: Sampling, clock: Clock, out: Decoded) -> Iterator[str]:
        """Decode after ``ids`` with the shared loop (pipelines/llm/decode.py), yielding text pieces
        and filling ``out``; every engine decodes through this one loop."""
        from taskrun.pipelines.llm.decode import stream

        return stream(self, ids, sampling, clock, out)
