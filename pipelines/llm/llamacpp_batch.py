"""Continuous batching on llama.cpp: several answers decoded together, one forward pass per step.

Why: a decode step streams every weight once whatever the number of sequences in it, so the
answers of concurrent clients decoded in one ``llama_decode`` cost little more than one (issue 32,
item 3). vLLM, TGI and llama-server batch the same way.

One context per loaded model, made with ``n_seq_max`` = the number of slots and a KV cache of
its own per sequence (``kv_unified`` off: each slot holds ``n_ctx_seq`` tokens). Each answer is
still decoded by the one shared loop (pipelines/llm/decode.py) on its job's own thread, through a
:class:`Sequence`, a per-job view of the engine: its sampling settings, seed, stop strings,
max_tokens, grammar, streaming, metrics and cancellation are the single-stream path's.
``Sequence.decode_step`` hands its token to the batch and waits: the first thread to find every
running sequence's token in (or ``WINDOW_S`` gone since the first one came and the last step
ended: the sequences that step served are sampling, and a token handed in during it waits for
theirs, else the two groups would step in turn to the end) runs the step for all of them, one
``llama_batch`` with one ``seq_id`` per sequence in slot order (llama.cpp reuses its graph only
for the same sequences in the same order: in arrival order it rebuilt it every step, and a
4-row step of the 1.5B took 150-170 ms instead of 115-128), and hands each its logits. A
sequence joins with its prompt, read in the same steps as the running sequences' tokens (one
``llama_decode`` for their rows and as much of the waiting prompts as a batch holds, as
llama-server does; 4 clients at once took 10 % less wall time than with each prompt read alone
while the others waited), and leaves with ``free``
(``llama_memory_seq_rm`` of nothing: its KV stays for the next job's shared prefix), so a client
that goes away ends only its own sequence.

Prompt cache per slot, as the single-stream engine's (llamacpp.py): a new job takes the free slot
of its own cache scope (tasks/cache_scope.py, the API key) whose tokens share the longest prefix
with its prompt, keeps that prefix and reads the rest; a slot last used by another scope is read
whole and reports 0 cached tokens. Where the engine has a float16 prompt copy (a small 4/5-bit
GGUF: models/gguf.py), prompts are read on it as on the single-stream path, under the decode lock:
the slot's kept prefix is copied to the copy's context, the rest read there, and the sequence
copied back into the slot (``llama_state_seq_*``), so a batched answer at temperature 0 is the
one the CLI gives for the same prompt (read on the 4-bit model instead, the answers parted).

Same tokens as the single-stream path: a step of several sequences runs llama.cpp's
matrix-matrix kernels where one sequence runs matrix-vector ones, so logits can differ in the last
bits (up to 1.4e-5 between a step of 1 and of 2 sequences on the tiny test model) and a near-tie
can flip; tests/test_batching.py requires the first 32 tokens to agree.
"""

from __future__ import annotations

import os
import threading
import time

from taskrun.models.fit import _available_ram
from taskrun.pipelines.llm.kv_state import read_on_copy
from taskrun.pipelines.llm.llamacpp_native import BATCH, decode_threads, log_tail, prompt_threads
from taskrun.pipelines.llm.llamacpp_pool import SHARED
from taskrun.tasks import cache_scope, seq_batch
from taskrun.tasks.base import TaskError
from taskrun.tasks.seq_batch import Join

WINDOW_S = 0.003  # how long a step waits for a running sequence's token (its thread is sampling)
ARRIVE_S = 0.05  # how long a step that reads a prompt waits for the prompts of jobs on their way
SEQ_CTX = 4096  # tokens per sequence (prompt + answer), at most the model's window
AUTO_MAX = 4  # slots when --parallel is not given: at most this many, fewer if memory is short
KV_SHARE = 0.25  # the share of available memory the KV cache of the auto slots may take
MIN_REUSE = 16  # the shortest shared prefix worth keeping (llamacpp.py)
RECHECK = 16  # steps between two looks at the cores other processes leave free (llamacpp.py)


def kv_bytes_per_token(lib, model) -> int:
    """Bytes of float16 K and V that one token of one sequence takes, every layer together."""
    layers, embd = lib.llama_model_n_layer(model), lib.llama_model_n_embd(model)
    heads, kv_heads = lib.llama_model_n_head(model), lib.llama_model_n_head_kv(model)
    return 2 * layers * kv_heads * (embd // max(1, heads)) * 2


def auto_slots(per_seq_bytes: int, available: int | None = None) -> int:
    """How many sequences to make room for: AUTO_MAX, or fewer where their KV caches together
    would take more than KV_SHARE of the memory available now; at least 1."""
    available = _available_ram() if available is None else available
    return max(1, min(AUTO_MAX, int(available * KV_SHARE) // max(1, per_seq_bytes)))


class _Slot:
    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []  # ids whose KV this sequence holds
        self.scope: str | None = cache_scope.OFF  # whose tokens they are
        self.prompt_end: tuple[int, object] | None = None  # (n, logits) after its last prompt read
        self.busy = False
        self.opening = False  # taken, its prompt not yet handed to the steps (nor read on the copy)
        self.used_at = 0.0
        self.token = 0  # the token handed in for the next step
        self.prompt: list[int] = []  # the prompt being read in the steps, and how far it is read
        self.prompt_pos = 0
        self.logits = None  # that step's logits (None while waiting)
        self.error: BaseException | None = None


class BatchEngine:
    """The batch context of one loaded LlamaCppEngine (``base``): its slots and its steps."""

    def __init__(self, base, join: Join) -> None:
        self.base, self.lib, self.join = base, base.lib, join
        lib, model = base.lib, base.native.model
        self.n_ctx_seq = min(base.context, SEQ_CTX)
        per_seq = kv_bytes_per_token(lib, model) * self.n_ctx_seq
        n = join.parallel if join.parallel > 0 else auto_slots(per_seq)
        p = lib.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n * self.n_ctx_seq, BATCH, BATCH, n
        p.kv_unified, p.no_perf = False, True
        self.decode_n = self.n_threads = p.n_threads = p.n_threads_batch = decode_threads()
        self.ctx = lib.llama_init_from_model(model, p) or None
        if self.ctx is None:
            raise TaskError(
                f"llama.cpp could not make a batch context of {n} x {self.n_ctx_seq} tokens for "
                f"{base.path.name} ({log_tail()}); lower --parallel or free memory"
            )
        self.mem = lib.llama_get_memory(self.ctx)
        self.n_ctx_seq = min(self.n_ctx_seq, int(lib.llama_n_ctx_seq(self.ctx)))
        self.slots = [_Slot(i) for i in range(n)]
        # one KV cache per sequence, of one attention kind: a sequence's state can be moved to and
        # from the float16 prompt copy's context (copy_seq); sliding-window and recurrent models' cannot
        self.plain_kv = not (
            lib.llama_model_n_swa(model) > 0 or lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model)
        )
        self.batch = lib.llama_batch_init(max(BATCH, n), 0, 1)
        self.cond = threading.Condition()  # slots, pending steps, the join's counts
        self.decode_lock = threading.Lock()  # one llama_decode at a time (prefills and steps)
        self.pending: list[_Slot] = []  # slots whose token is in for the next step
        self.prompting: list[_Slot] = []  # slots whose prompt is (partly) still to read
        self.first_at = 0.0
        self.ended_at = 0.0  # when the last step ended
        self.stepping = False
        self.steps = 0
        self.decoding = 0  # slots past their prefill, not yet freed
        with join.lock:
            join.slots = n

    # ----------------------------------------------------------------- slots

    def take(self, ids: list[int], scope: str | None) -> tuple[_Slot, int]:
        """A free slot for a prompt of ``ids`` (waiting for one if all are busy) → (slot, how many
        leading tokens of its KV to keep): the slot of the same scope sharing the longest prefix,
        else the one used least recently."""
        reuse = scope is not cache_scope.OFF and os.environ.get("TASKRUN_PROMPT_CACHE", "1") != "0"
        with self.cond:
            seq_batch.landed()  # here: no longer on its way (ARRIVE_S)
            counted = False
            while not any(not s.busy for s in self.slots):
                if not counted:
                    counted = True
                    self._count(waiting=1)
                self.cond.wait()
            if counted:
                self._count(waiting=-1)
            free = [s for s in self.slots if not s.busy]
            best, keep = min(free, key=lambda s: s.used_at), 0
            if reuse:
                for s in free:
                    k = _shared(ids, s.tokens) if s.scope == scope else 0
                    if k < len(ids) or s.prompt_end is None or s.prompt_end[0] != k:
                        k = min(k, len(ids) - 1)  # the last prompt token is read again: its logits start the answer
                    if k >= MIN_REUSE and k > keep:
                        best, keep = s, k
            best.busy, best.opening, best.used_at = True, True, time.monotonic()
            self._count(running=1)
            return best, keep

    def _count(self, running: int = 0, waiting: int = 0) -> None:
        with self.join.lock:
            self.join.running += running
            self.join.waiting += waiting

    def prefill(self, slot: _Slot, ids: list[int], keep: int, scope: str | None):
        """Read ``ids`` into ``slot`` after the ``keep`` tokens it already holds → the logits after them."""
        lib, n = self.lib, len(ids)
        if n > self.n_ctx_seq:
            raise TaskError(
                f"the prompt is {n} tokens; a batched sequence holds at most {self.n_ctx_seq} "
                f"(prompt + answer): shorten it, or start the server with --parallel 1"
            )
        with self.decode_lock:
            slot.scope = cache_scope.OFF  # unknown while the read is under way (it may fail half-way)
            end, slot.prompt_end = slot.prompt_end, None
            if keep >= n and not (end is not None and end[0] == n):
                keep = n - 1  # the last prompt token is read again: its logits start the answer
            if not lib.llama_memory_seq_rm(self.mem, slot.seq, keep, -1):
                keep = 0
                lib.llama_memory_seq_rm(self.mem, slot.seq, 0, -1)
            del slot.tokens[keep:]
            logits = None
            if keep == n and end is not None and end[0] == n:
                # the prompt its last job read, whole: that read's logits, bit for bit (reading its
                # last token again alone would round differently and could change the answer)
                logits = end[1]
            elif keep < n and self.plain_kv and self.base._prompt_native() is not None:
                self._threads(prompt_threads())  # a prompt is many tokens: the cores free now
                logits = read_on_copy(self, slot, ids, keep)
                self._threads(self.decode_n)
                if logits is None and len(slot.tokens) < keep:  # the copy failed half-way: read it all here
                    keep = 0
        if logits is None:  # read here, in the steps, beside the other sequences' tokens
            logits = self._await(slot, lambda: self._ask_prompt(slot, ids, keep))
        else:
            with self.cond:
                slot.opening = False
                self.cond.notify_all()
        slot.prompt_end = (n, logits)
        slot.scope = scope
        with self.cond:
            self.decoding += 1
        return logits.copy()

    def _ask_prompt(self, slot: _Slot, ids: list[int], keep: int) -> None:
        slot.prompt, slot.prompt_pos, slot.opening = ids, keep, False
        self.prompting.append(slot)

    def _coming(self) -> int:
        """Prompts on their way (called with ``cond`` held): slots taken whose prompt is not in
        yet, and jobs the server took that have not reached the engine, as many as slots are free."""
        with self.join.lock:
            coming = self.join.coming
        free = sum(not s.busy for s in self.slots)
        return sum(s.opening for s in self.slots) + min(coming, free)

    def step(self, slot: _Slot, token: int):
        """Append ``token`` to ``slot``'s sequence in the next batched step → its next logits."""
        return self._await(slot, lambda: self._ask_token(slot, token))

    def _ask_token(self, slot: _Slot, token: int) -> None:
        slot.token = token
        self.pending.append(slot)

    def _await(self, slot: _Slot, ask):
        """Queue ``slot``'s next token or prompt (``ask``) and wait for its logits, leading the
        step when every decoding sequence's token is in, or WINDOW_S after the first request came
        and the last step ended; a prompt alone waits WINDOW_S for prompts sent with it. A step that
        would read a prompt waits up to ARRIVE_S for the prompts of jobs on their way (``_coming``):
        4 prompts of ~40 tokens read in one pass took 2.4-2.9 s on the 1.5B, one a pass 3.3-3.6 s."""
        with self.cond:
            slot.logits, slot.error = None, None
            if not self.pending and not self.prompting:
                self.first_at = time.monotonic()
            ask()
            self.cond.notify_all()
            while slot.logits is None and slot.error is None:
                # the window opens when the batch is free: a token handed in during a step waits
                # for the sequences that step served (they are sampling), so no cohort forms
                late = time.monotonic() - max(self.first_at, self.ended_at)
                asked = bool(self.pending or self.prompting)
                all_in = len(self.pending) >= self.decoding and (self.decoding > 0 or not self.prompting)
                hold = bool(self.prompting) and late < ARRIVE_S and self._coming() > 0
                if not self.stepping and asked and not hold and (all_in or late >= WINDOW_S):
                    self._lead()
                else:
                    window = ARRIVE_S if hold else WINDOW_S
                    self.cond.wait(timeout=max(0.0005, window - late) if asked else None)
            if slot.error is not None:
                raise slot.error
            return slot.logits

    def _lead(self) -> None:
        """Run one llama_decode for every pending token and as much of the waiting prompts as the
        batch holds (called, and returning, with ``cond`` held)."""
        group, self.pending, self.stepping = sorted(self.pending, key=lambda s: s.seq), [], True
        prompts, self.prompting = self.prompting, []
        self.cond.release()
        try:
            try:
                with self.decode_lock:
                    rows = [(s.seq, s.token, len(s.tokens), True) for s in group]
                    reads = self._prompt_rows(prompts, rows)
                    if reads:
                        self._threads(prompt_threads())  # a prompt is many tokens: the cores free now
                    elif group:
                        self.steps += 1
                        if self.steps % RECHECK == 0:  # a neighbour may have started (or stopped)
                            self.decode_n = decode_threads()
                        self._threads(self.decode_n)
                    self._fill(rows)
                    self._decode(len(rows))
                    for i, s in enumerate(group):
                        s.tokens.append(s.token)
                        s.logits = self.base._logits(self.lib.llama_get_logits_ith(self.ctx, i))
                    for s, start, k, last in reads:
                        s.tokens.extend(s.prompt[start : start + k])
                        s.prompt_pos = start + k
                        if last is not None:
                            s.logits = self.base._logits(self.lib.llama_get_logits_ith(self.ctx, last))
                if group:
                    with self.join.lock:
                        self.join.batch_size = len(group)
                        self.join.max_batch_size = max(self.join.max_batch_size, len(group))
                    if self.join.on_step is not None:
                        self.join.on_step(len(group))
                if reads and self.join.on_prompts is not None:
                    self.join.on_prompts(len(reads))
            except BaseException as exc:
                for s in group + prompts:
                    if s.logits is None:
                        s.error = exc
        finally:
            self.cond.acquire()
            self.prompting[:0] = [s for s in prompts if s.logits is None and s.error is None]
            self.stepping, self.ended_at = False, time.monotonic()
            self.cond.notify_all()

    def _prompt_rows(self, prompts: list[_Slot], rows: list) -> list[tuple]:
        """Append the next tokens of each waiting prompt to ``rows``, as many as the batch holds,
        the first waiting first → (slot, start, count, its last row's index when that ends its
        prompt, else None) for each prompt with tokens in this step."""
        room, reads = max(BATCH, len(self.slots)) - len(rows), []
        for s in prompts:
            k = min(room, len(s.prompt) - s.prompt_pos)
            if k <= 0:
                continue
            start, done = s.prompt_pos, s.prompt_pos + k == len(s.prompt)
            rows.extend((s.seq, s.prompt[start + i], start + i, done and i == k - 1) for i in range(k))
            reads.append((s, start, k, len(rows) - 1 if done else None))
            room -= k
        return reads

    def leave(self, slot: _Slot, decoded: bool) -> None:
        """``slot``'s sequence ended (or its client left): free for the next job, its KV kept."""
        with self.cond:
            slot.busy = slot.opening = False
            if slot.scope is cache_scope.OFF:
                slot.tokens, slot.prompt_end = [], None
            if decoded:
                self.decoding -= 1
            self._count(running=-1)
            self.cond.notify_all()

    # ----------------------------------------------------------------- llama.cpp

    def _threads(self, n: int) -> None:
        """llama.cpp's threads from now on: a step of a few sequences is decode work, and takes
        the single-stream engine's decode threads (llamacpp_native.decode_threads)."""
        if n != self.n_threads:
            self.lib.llama_set_n_threads(self.ctx, n, n)
            self.n_threads = n

    def _fill(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """The batch as (seq_id, token, position, wants logits) rows."""
        b = self.batch
        for i, (seq, token, pos, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)

    def _decode(self, n: int) -> None:
        with SHARED.on(self.lib, self.ctx):  # llama-server's steady threads, not new ones each call
            rc = self.lib.llama_decode(self.ctx, self.batch)
        if rc != 0:
            # what llama.cpp kept of a failed batch is unknown: every slot starts over
            for s in self.slots:
                self.lib.llama_memory_seq_rm(self.mem, s.seq, 0, -1)
                s.tokens, s.scope, s.prompt_end = [], cache_scope.OFF, None
            raise TaskError(f"llama.cpp failed to evaluate a batch of {n} tokens (llama_decode returned {rc})")

    def sequence(self):
        from taskrun.pipelines.llm.batch_sequence import Sequence

        return Sequence(self)

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is None or getattr(self, "ctx", None) is None:
            return
        try:
            lib.llama_batch_free(self.batch)
            lib.llama_free(self.ctx)
        except Exception:  # at interpreter exit the library may be half gone; the OS frees it all
            pass
        self.ctx = None


_MADE = threading.Lock()


def batch_for(engine, join: Join) -> BatchEngine:
    """``engine``'s batch context, made on first use (one per loaded model)."""
    with _MADE:
        batch = getattr(engine, "_batch", None)
        if batch is None:
            batch = engine._batch = BatchEngine(engine, join)
        return batch


def _shared(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
