"""The llama.cpp LLM engine: a GGUF runs as GGUF, its quantised weights read in place.

Why: decoding one token streams every weight once, so the bytes per weight set the speed. The
transformers engine has to de-quantise a GGUF (to float16 at best, a one-time conversion that
takes tens of seconds and a float32 detour); llama.cpp reads the 4-bit blocks directly with its
own kernels, reads the file into memory as stored (not mapped: a file changed on disk under a
running server must not crash it, llamacpp_native.read_into_memory), with no conversion first.

llama.cpp is used as the forward pass only (``prefill``, ``decode_step``, ``free`` over the
low-level ``llama_decode``): taskrun's own loop (pipelines/llm/decode.py) samples, stops, seeds
and times every token, so streaming, stop sequences, seeds, finish reasons and the metrics
behave exactly as on the transformers engine. Tokens come from the GGUF's own vocabulary, the
chat template from its ``tokenizer.chat_template``, rendered with jinja2 as transformers does
(llama-cpp-python's ``Jinja2ChatFormatter``: same sandbox, same extensions, same ``tojson``).

Threads, the KV cache and the float16 copy that reads prompts live in llamacpp_native.py:
single-token steps on ``TASKRUN_DECODE_THREADS`` (1 by default, as for torch), prompts on the
cores other processes leave free; the KV cache is sized to what a job needs (prompt + room,
rounded up), not the whole window. llama.cpp's own log never reaches stderr (its last lines
explain a failed load).

Prompt cache, as llama-server's: ``free`` keeps the KV cache, and the next job reads only what
its prompt does not share with the tokens already cached (the next turn of `run chat`, a chat
client resending the conversation to `run serve`): the common prefix stays, the rest is cut
(``llama_memory_seq_rm``) and the new tokens are read, on the float16 prompt copy where there is
one (the KV cache goes there and back: ~ms per hundred tokens). A prompt identical to the last one
read is answered from the logits kept after it, so a repeated job gives exactly the first one's
text. A prompt that extends the cache (chat turn 2) reads its earlier answer's KV as the 4-bit
model wrote it while decoding, where a cold read recomputes it: the logits differ in the last
digits, and a small model's greedy text can differ from a cold run's from that turn on (measured
on SmolLM2-135M; llama-server's prompt cache does the same). Either way it is reproducible: the
same jobs in the same order give the same texts.
``cached_tokens`` says how many prompt tokens a prefill kept (generate's ``cached_prompt_tokens``).
TASKRUN_PROMPT_CACHE=0 turns it off: every prompt is read whole, as a fresh sequence.
The cache is reused only by a job of the same scope (tasks/cache_scope.py: a server's tenant, the
API key): a job of another tenant reads its prompt whole and reports 0 cached tokens, so no client
learns how much of its prompt matched another's.
"""

from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager, nullcontext

import numpy as np

from taskrun.models.gguf import gguf_file, gguf_metadata
from taskrun.pipelines import cached_model
from taskrun.pipelines.device import decode_threads
from taskrun.pipelines.llm.engine import LLMEngine
from taskrun.pipelines.llm.llamacpp_native import (
    CopyRefused,
    Native,
    file_type,
    kernel_note,
    library,
    prompt_copy,
    wants_prompt_copy,
)
from taskrun.pipelines.llm.llamacpp_native import decode_threads as native_decode_threads
from taskrun.tasks import cache_scope, seq_batch
from taskrun.tasks.base import ModelCard, TaskError

MIN_CTX = 512  # the smallest KV cache made: a short job's cache, grown by powers of two on demand
# The shortest shared prefix worth keeping: below it a fresh read costs about what the cut does,
# and a fresh read goes through the float16 prompt copy (better first-token logits, see
# llamacpp_native). 16 tokens is less than a chat template's system header.
MIN_REUSE = 16
# Single-token steps between two looks at how many cores other processes leave free (~2 ms a look;
# 16 steps of SmolLM2-135M are ~150 ms, so a look costs ~1% and a new neighbour is seen within ~0.2 s).
RECHECK = 16


class LlamaCppEngine(LLMEngine):
    """A GGUF loaded by llama.cpp: the model (weights read into memory) and one context."""

    runtime = "llama.cpp"

    def __init__(self, lib, native: Native, meta: dict, digest: str) -> None:
        self.lib, self.native, self.path, self.digest = lib, native, native.path, digest
        self.vocab = lib.llama_model_get_vocab(native.model)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self.device, self.dtype = "cpu", file_type(meta)
        self.context = int(lib.llama_model_n_ctx_train(native.model))
        self.eos = {t for t in (lib.llama_vocab_eos(self.vocab), lib.llama_vocab_eot(self.vocab)) if t >= 0}
        self.eos |= {t for t in _special_ids(meta) if lib.llama_vocab_is_eog(self.vocab, t)}
        self.template = meta.get("tokenizer.chat_template") or None
        self._formatter = None
        self._strs: list[str] | None = None
        self._texts: list[tuple[bytes, bool]] | None = None  # token pieces, read once (_pieces)
        self._one = (lib.llama_token * 1)()
        self._steps = 0  # single-token steps since decoding() began (RECHECK counts them)
        self.cached_tokens = 0  # prompt tokens the last prefill kept from the KV cache (not read again)
        # the float16 copy that reads prompts (llamacpp_native), made and loaded on the first one
        self.prompt_native: Native | None = None
        self._copy_wanted = wants_prompt_copy(self.path, self.dtype)
        self.notes: list[str] = []  # why a job ran otherwise than planned (no prompt copy): each job says so

    @classmethod
    def load(cls, card: ModelCard, device: str, dtype: str) -> LlamaCppEngine:
        """``card``'s GGUF on the CPU, in its own weight format; loaded once per process."""
        path = gguf_file(card)
        if path is None:
            raise TaskError(
                f"the llama.cpp runtime reads GGUF files; {card.name} is not one "
                f"({card.format or 'unknown format'}): use --runtime transformers"
            )
        if device not in ("auto", "", None, "cpu"):
            raise TaskError(
                f"this llama.cpp build runs on the CPU only; use --device cpu, or --runtime "
                f"transformers for --device {device}"
            )
        if dtype not in ("auto", "", None):
            raise TaskError(
                f"llama.cpp runs the GGUF's own weights as stored; --dtype {dtype} needs "
                f"--runtime transformers (or leave --dtype auto)"
            )
        meta = gguf_metadata(path)

        def build() -> LlamaCppEngine:
            lib = library()
            return cls(lib, Native(lib, path), meta, card.digest)

        engine = cached_model(card, cls.runtime, "cpu", file_type(meta), "causal-lm", build)
        note = kernel_note()  # which kernels ran (AVX2, AVX-512, AMX): every job's run log says so
        if note not in card.extra.get("ran", ()):
            card.extra["ran"] = [*card.extra.get("ran", ()), note]
        return engine

    # ----------------------------------------------------------------- text ↔ tokens

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        lib, data = self.lib, text.encode("utf-8")
        size = len(data) + 8  # a token is at least one byte, plus BOS/EOS
        buf = (lib.llama_token * size)()
        n = lib.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, True)
        if n < 0:
            size = -n
            buf = (lib.llama_token * size)()
            n = lib.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, True)
        return buf[:n]

    def encode(self, text: str) -> list[int]:
        return self._tokenize(text, add_special=False)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        lib, n = self.lib, len(ids)
        if n == 0:
            return ""
        arr = (lib.llama_token * n)(*ids)
        size = 16 * n + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            got = lib.llama_detokenize(self.vocab, arr, n, buf, size, False, not skip_special)
            if got >= 0:
                return buf.raw[:got].decode("utf-8", "replace")
            size = -got + 1
        raise RuntimeError(f"llama_detokenize failed for {n} tokens")

    def prompt_ids(
        self, text: str, system: str = "", raw: bool = False, prefix: str = "", history: tuple = ()
    ) -> list[int]:
        if raw or not self.template:
            turns = "".join(f"{said}\n\n" for _, said in history)  # no template: the turns as text
            body = (system + "\n\n" if system else "") + turns + text + prefix
            return self._tokenize(body, add_special=True)
        messages = (
            ([{"role": "system", "content": system}] if system else [])
            + [{"role": role, "content": said} for role, said in history]
            + [{"role": "user", "content": text}]
        )
        try:
            rendered = self.formatter()(messages=messages).prompt
        except Exception as exc:  # jinja2 raises many kinds; the template is the model's
            raise TaskError(
                f"the chat template of {self.path.name} failed ({exc}); pass --raw to send the prompt without it"
            ) from None
        return self._tokenize(rendered + prefix, add_special=False)

    def formatter(self):
        """The GGUF's chat template, compiled once."""
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            self._formatter = Jinja2ChatFormatter(
                self.template,
                eos_token=self._text(self.lib.llama_vocab_eos(self.vocab)),
                bos_token=self._text(self.lib.llama_vocab_bos(self.vocab)),
                add_generation_prompt=True,
            )
        return self._formatter

    def _text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.lib.llama_vocab_get_text(self.vocab, token).decode("utf-8", "replace")

    def _pieces(self) -> list[tuple[bytes, bool]]:
        """(bytes, special) per token id: ``llama_token_to_piece``'s exact bytes (half a character
        for some byte-level pieces), a control token's text marked special."""
        if self._texts is None:
            lib, vocab, buf, out = self.lib, self.vocab, ctypes.create_string_buffer(256), []
            for t in range(self.n_vocab):
                n = lib.llama_token_to_piece(vocab, t, buf, 256, 0, False)
                if n > 0:
                    out.append((buf.raw[:n], False))
                    continue
                n = lib.llama_token_to_piece(vocab, t, buf, 256, 0, True)  # control: its text
                out.append((buf.raw[: max(n, 0)], n > 0))
            self._texts = out
        return self._texts

    def token_bytes(self) -> list[bytes]:
        return [b"\xff" + b if special else b for b, special in self._pieces()]

    def token_texts(self) -> list[str]:
        if self._strs is None:
            self._strs = [b.decode("utf-8", "replace") for b, _ in self._pieces()]
        return self._strs

    # ----------------------------------------------------------------- forward passes

    def _size(self, need: int) -> int:
        """The KV cache to make for ``need`` tokens: powers of two from MIN_CTX, at most the window
        (a short job on an 8k-context model does not hold an 8k cache)."""
        size = MIN_CTX
        while size < need:
            size *= 2
        return max(need, min(size, self.context))

    def _logits(self, ptr):
        """The logits row llama.cpp points at, copied (it reuses the buffer) into a float32 numpy
        array by one memmove. numpy, not torch: a job on llama.cpp then never imports torch (~2 s
        of a cold `run generate`); and a torch copy of 49k floats ran on its thread pool, whose
        wake-ups cost milliseconds per token beside busy neighbours (measured: 14 ms)."""
        out = np.empty(self.n_vocab, dtype=np.float32)
        ctypes.memmove(out.ctypes.data, ptr, self.n_vocab * 4)
        return out

    def _prompt_native(self) -> Native | None:
        """The float16 copy's model, made and loaded on first use; None where there is none."""
        if self.prompt_native is None and self._copy_wanted:
            self._copy_wanted = False  # one attempt per load: a failure falls back for good
            try:
                path = prompt_copy(self.lib, self.path, self.digest)
            except CopyRefused as exc:  # too little room, or llama.cpp failed: each job's notes say so
                self.notes.append(str(exc))
                return None
            except OSError as exc:  # an unwritable cache: prompts read from the file itself
                self.notes.append(
                    f"no float16 prompt copy of {self.path.name} ({exc.strerror or exc}), so prompts were "
                    f"read from the 4-bit weights (the answer can differ); TASKRUN_PROMPT_COPY=0 to silence this"
                )
                return None
            try:
                self.prompt_native = Native(self.lib, path) if path else None
            except TaskError:  # a damaged copy: prompts read from the file itself; remade next time
                path.unlink(missing_ok=True)
        return self.prompt_native

    def prefill(self, ids: list[int], room: int = 0):
        native, n = self.native, len(ids)
        self.cached_tokens = 0
        scope = cache_scope.current()
        # whose tokens the KV cache holds lives with the context, which copies of this engine share
        ours = scope is not cache_scope.OFF and scope == native.scope  # another tenant's tokens are not reused
        native.scope = cache_scope.OFF  # unknown while a read is under way (it may fail half-way)
        if ours and native.n_ctx >= n + room and os.environ.get("TASKRUN_PROMPT_CACHE", "1") != "0":
            logits = self._resume(ids)
            if logits is not None:
                native.prompt_end = (n, logits.copy())
                native.scope = scope
                return logits
        size = self._size(n + room)
        native.ensure(size)
        native.clear()
        arr = (self.lib.llama_token * n)(*ids)
        helper = self._prompt_native()
        logits = None
        if helper is not None:
            with helper.lock:
                helper.ensure(size)
                helper.clear()
                logits = self._logits(helper.eval(arr, n))
                if not helper.move_kv_to(native):
                    logits = None
        if logits is None:
            logits = self._logits(native.eval(arr, n))
        native.prompt_end = (n, logits.copy())
        native.scope = scope
        return logits

    def _resume(self, ids: list[int]):
        """The logits after ``ids`` read on top of the KV cache's shared prefix, or None where too
        little is shared (the caller reads the prompt whole). A prompt equal to the last one read
        comes back with that read's logits, bit for bit: reading its last token again on the
        4-bit model instead of the float16 copy could change the answer."""
        native, n = self.native, len(ids)
        same = _shared(ids, native.tokens)
        end = native.prompt_end
        if same == n and end is not None and end[0] == n and native.keep(n):
            self.cached_tokens = n
            return end[1].copy()
        keep = min(same, n - 1)  # the last prompt token is read again: its logits start the answer
        if keep < MIN_REUSE or not native.keep(keep):
            return None
        rest = ids[keep:]
        arr = (self.lib.llama_token * len(rest))(*rest)
        helper = self._prompt_native()
        with helper.lock if helper is not None else nullcontext():
            if helper is not None:
                helper.ensure(native.n_ctx)
            if helper is not None and native.move_kv_to(helper):
                # the new tokens read on the float16 copy, as a cold prompt is: its KV goes there and back
                logits = self._logits(helper.eval(arr, len(rest)))
                if not helper.move_kv_to(native):
                    helper.clear()
                    return None  # both caches are empty now: the caller reads the prompt whole
            else:
                logits = self._logits(native.eval(arr, len(rest)))
        self.cached_tokens = keep
        return logits

    def decode_step(self, token: int):
        self._steps += 1
        if self._steps % RECHECK == 0:  # a neighbour may have started (or stopped) since the last look
            self.native.decode_on(native_decode_threads())
        self._one[0] = token
        return self._logits(self.native.eval(self._one, 1))

    def stream(self, ids, sampling, clock, out):
        """The shared loop; a server job that may join its model's batch (tasks/seq_batch.py)
        decodes as one sequence of it (llamacpp_batch.py) instead of in this engine's own context."""
        join = seq_batch.current()
        if join is None:
            return super().stream(ids, sampling, clock, out)
        from taskrun.pipelines.llm.decode import stream
        from taskrun.pipelines.llm.llamacpp_batch import batch_for

        return stream(batch_for(self, join).sequence(), ids, sampling, clock, out)

    def free(self) -> None:
        """Nothing: the KV cache stays for the next job's shared prefix (see the module's docstring)."""

    @contextmanager
    def decoding(self):
        """llama.cpp's single-token steps on the cores free as the answer starts (looked at again
        every RECHECK steps: llamacpp_native.decode_threads). Torch (a sampled draw's softmax;
        greedy stays in numpy) on one thread between steps, as for the transformers engine: its
        pool's wake-ups cost more than 49k-float reductions."""
        self._steps = 0
        self.native.decode_on(native_decode_threads())
        with decode_threads(self.device):
            yield


def _shared(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _special_ids(meta: dict) -> set[int]:
    """Token ids the GGUF header names (eos, eot, padding, ...): the candidates for end of turn."""
    return {
        int(v)
        for k, v in meta.items()
        if k.startswith("tokenizer.ggml.") and k.endswith("_token_id") and isinstance(v, int)
    }
