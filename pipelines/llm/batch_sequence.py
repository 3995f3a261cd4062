"""One job's answer in the server's batch (pipelines/llm/llamacpp_batch.py): the engine as the
shared decode loop (pipelines/llm/decode.py) sees it."""

from __future__ import annotations

from contextlib import nullcontext

from taskrun.tasks import cache_scope


class Sequence:
    """One job's answer in the batch: the engine as the shared decode loop sees it."""

    def __init__(self, batch) -> None:
        base = batch.base
        self.batch, self.base = batch, base
        self.context, self.eos, self.device = batch.n_ctx_seq, base.eos, base.device
        self.cached_tokens = 0
        self.slot = None  # llamacpp_batch._Slot while the job holds one
        self._decoded = False

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.base.decode(ids, skip_special)

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def token_bytes(self) -> list[bytes]:
        return self.base.token_bytes()

    def prefill(self, ids: list[int], room: int = 0):
        scope = cache_scope.current()
        self.slot, keep = self.batch.take(ids, scope)
        logits = self.batch.prefill(self.slot, ids, keep, scope)
        self._decoded, self.cached_tokens = True, keep
        return logits

    def decode_step(self, token: int):
        assert self.slot is not None, "prefill first"
        return self.batch.step(self.slot, token)

    def free(self) -> None:
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.batch.leave(slot, self._decoded)
            self._decoded = False

    def decoding(self):
        return nullcontext()
