"""One sequence's KV cache moved between llama.cpp contexts through ``llama_state_seq_*``: the
float16 prompt copy's context (one stream) and the model's own, or its batch's (a stream per
sequence: pipelines/llm/llamacpp_batch.py).
"""

from __future__ import annotations

import ctypes

from taskrun.tasks.base import TaskError


def copy_seq(lib, src_ctx, src_seq: int, dst_ctx, dst_seq: int, streams: tuple[int, int] = (1, 1)) -> bool:
    """Copy sequence ``src_seq``'s KV cache of ``src_ctx`` into sequence ``dst_seq`` of ``dst_ctx``
    (whose model has the same shape; what ``dst_seq`` held is replaced). ``streams``: the KV
    streams of the two contexts (1 for a unified cache, n_seq_max for a batch context with a
    cache per sequence): where they differ the state is rewritten from one layout to the other
    (``restream``). False where llama.cpp could not."""
    size = lib.llama_state_seq_get_size(src_ctx, src_seq)
    buf = (ctypes.c_uint8 * size)()
    if lib.llama_state_seq_get_data(src_ctx, buf, size, src_seq) != size:
        return False
    if streams[0] != streams[1]:
        src = src_seq if streams[0] > 1 else 0
        dst = dst_seq if streams[1] > 1 else 0
        blob = restream(bytes(buf), streams[0], src, streams[1], dst)
        if blob is None:
            return False
        size, buf = len(blob), (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
    return lib.llama_state_seq_set_data(dst_ctx, buf, size, dst_seq) == size


def restream(blob: bytes, n_from: int, s_from: int, n_to: int, s_to: int) -> bytes | None:
    """One sequence's state from a plain KV cache of ``n_from`` streams (the sequence in stream
    ``s_from``) rewritten for one of ``n_to`` streams (in stream ``s_to``), or None where it is not
    that shape. The KV part is a stream count, then per stream a cell count and, when it is not 0,
    the cells (llama_kv_cache::state_write; the cells' own sequence ids are ignored on reading);
    llama.cpp 0.3.36 puts 8 bytes before it (a tag, then the sequence id). llama.cpp refuses a
    stream count other than its own even for one sequence, whose cells all go to that
    sequence's stream anyway."""
    zero = b"\0\0\0\0"
    before, after = 4 * s_from, 4 * (n_from - 1 - s_from)
    for head in (8, 0):
        kv = blob[head:]
        if len(kv) < 4 + before + 8 + after or int.from_bytes(kv[:4], "little") != n_from:
            continue
        if kv[4 : 4 + before] != zero * s_from or (after and kv[len(kv) - after :] != zero * (n_from - 1 - s_from)):
            continue
        section = kv[4 + before : len(kv) - after]
        if section[:4] == zero:
            continue  # an empty sequence: nothing to move
        prefix = blob[:head]
        if head == 8 and int.from_bytes(prefix[4:8], "little") == s_from:
            prefix = prefix[:4] + s_to.to_bytes(4, "little")
        return prefix + n_to.to_bytes(4, "little") + zero * s_to + section + zero * (n_to - 1 - s_to)
    return None


def read_on_copy(batch, slot, ids: list[int], keep: int):
    """The logits after ``ids`` read into ``slot`` of ``batch`` (llamacpp_batch.BatchEngine) on
    the engine's float16 prompt copy, as the single-stream path reads prompts (so a batched
    answer is the answer a lone run gives): the slot's kept
    prefix goes to the copy's context, the rest is read there, and the whole sequence comes
    back into the slot. None where there is no copy or llama.cpp could not move the KV (the
    slot then holds its first ``len(slot.tokens)`` tokens). Called under ``decode_lock``."""
    helper = batch.base._prompt_native() if batch.plain_kv else None
    if helper is None:
        return None
    lib, streams = batch.lib, len(batch.slots)
    with helper.lock:
        try:
            helper.ensure(batch.n_ctx_seq)
            helper.clear()
            if keep and not copy_seq(lib, batch.ctx, slot.seq, helper.ctx, 0, (streams, 1)):
                return None
            helper.tokens = list(ids[:keep])
            rest = ids[keep:]
            logits = batch.base._logits(helper.eval((lib.llama_token * len(rest))(*rest), len(rest)))
            lib.llama_memory_seq_rm(batch.mem, slot.seq, 0, -1)
            del slot.tokens[:]
            if not copy_seq(lib, helper.ctx, 0, batch.ctx, slot.seq, (1, streams)):
                lib.llama_memory_seq_rm(batch.mem, slot.seq, 0, -1)
                return None
            slot.tokens.extend(ids)
            return logits
        except TaskError:
            lib.llama_memory_seq_rm(batch.mem, slot.seq, 0, -1)
            del slot.tokens[:]
            return None
        finally:
            helper.clear()
