"""How the server's batch (pipelines/llm/llamacpp_batch.py) groups sequences into decode steps.

Two faults measured on the 1.5B default (issue 32, 4 clients against `llama-server --parallel 4`):
- a sequence that handed its token in while a step ran led the next step alone, and the rest
  then stepped without it: two cohorts alternating for the rest of the answers (1.9 rows per
  step instead of 4, `rows_per_step` in benchmarks/results/serve_batch_vs_llama_server.json);
- the rows went in the order the tokens came, so llama.cpp rebuilt its graph every step (it
  reuses one only for the same sequences in the same order): a 4-row step took 150-170 ms, 115-128
  ms in order, as llama-server's.

In-process, on the tiny GGUF (tests/tiny/gguf_llama.py), greedy, four threads.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest

from tests.tiny.gguf_llama import build as build_gguf

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (`make install` builds it)")

STEPS = 24


@pytest.fixture(scope="module")
def llm(tiny_dir):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.llamacpp import LlamaCppEngine

    return copy.copy(LlamaCppEngine.load(resolve(str(build_gguf(tiny_dir))), "cpu", "auto"))


def _in_threads(one, n: int = 4) -> None:
    """``one(k)`` for k in 0..n-1, each on a thread of its own; the first error any raised is
    raised here, in the test's thread."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            one(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def _run(llm, late_at: int | None):
    """Four sequences decode STEPS tokens each, all prefilled first, each step made 20 ms longer;
    the one on slot 0 is ``late_at`` that step by 30 ms once (a client's thread held up). → the
    decode steps' rows, as (seq ids) per step."""
    from taskrun.pipelines.llm.llamacpp_batch import BatchEngine
    from taskrun.tasks.seq_batch import Join

    batch = BatchEngine(llm, Join(4))
    steps: list[list[int]] = []
    fill = batch._fill

    def record(rows):
        if all(r[3] for r in rows) and len(rows) <= 4:  # a decode step: one row per sequence, each wants logits
            steps.append([r[0] for r in rows])
        fill(rows)

    batch._fill = record
    decode = batch._decode

    def slow(n):  # a step as long against sampling as a real model's (1.5B: 115-170 ms to ~1 ms)
        decode(n)
        time.sleep(0.02)

    batch._decode = slow
    prompts = [llm.prompt_ids(f"Story number {i}: once upon a time") for i in range(4)]
    seqs = [batch.sequence() for _ in prompts]
    ready = threading.Barrier(4)

    def one(k: int) -> None:
        seq = seqs[k]
        logits = seq.prefill(prompts[k])
        ready.wait(timeout=30)
        for i in range(STEPS):
            if late_at == i and seq.slot.seq == 0:
                time.sleep(0.03)
            logits = seq.decode_step(int(logits.argmax()))
        seq.free()

    _in_threads(one)
    return steps


def test_each_step_lists_its_sequences_in_one_order(llm):
    steps = _run(llm, None)
    assert sum(len(s) for s in steps) == 4 * STEPS
    assert all(s == sorted(s) for s in steps), steps


def test_a_late_sequence_rejoins_the_others_at_the_next_step(llm):
    """Slot 0's thread is held up 30 ms once. It misses one step and then steps alone once; the
    next step has all four again. Before, it and the rest alternated to the end: nearly 2 x STEPS
    steps. Slack for a loaded machine, where a thread may miss the 3 ms window now and then."""
    steps = _run(llm, 3)
    assert sum(len(s) for s in steps) == 4 * STEPS
    assert len(steps) <= STEPS + 6, f"{len(steps)} steps for {STEPS} tokens: the late sequence did not rejoin"
    assert sum(len(s) == 4 for s in steps) >= STEPS - 6


def test_a_prompt_that_comes_mid_answer_is_read_in_the_others_steps(llm):
    """Three sequences decode; a fourth job's prompt comes after their fifth step. It is read in
    a step with their tokens (one llama_decode: their rows and its prompt's), as llama-server
    does, instead of alone while they wait; its answer then decodes in the same steps."""
    import numpy as np

    from taskrun.pipelines.llm.llamacpp_batch import BatchEngine
    from taskrun.tasks.seq_batch import Join

    batch = BatchEngine(llm, Join(4))
    calls: list[list[tuple]] = []
    fill = batch._fill

    def record(rows):
        calls.append(list(rows))
        fill(rows)

    batch._fill = record
    prompts = [llm.prompt_ids(f"Story number {i}: once upon a time there was") for i in range(4)]
    started = threading.Event()
    answers: dict[int, list[int]] = {}

    def one(k: int) -> None:
        if k == 3:
            started.wait(timeout=30)
        seq = batch.sequence()
        logits, out = seq.prefill(prompts[k]), []
        for i in range(STEPS):
            out.append(int(np.argmax(logits)))
            if k == 0 and i == 5:
                started.set()
            logits = seq.decode_step(out[-1])
            time.sleep(0.002)  # a real model's step gives the late prompt time to come
        answers[k] = out
        seq.free()

    _in_threads(one)
    late = next(s.seq for s in batch.slots if s.tokens[: len(prompts[3])] == prompts[3])  # the 4th job's slot
    mixed = [c for c in calls if any(r[0] == late and not r[3] for r in c) and any(r[0] != late for r in c)]
    assert mixed, "the late prompt was read alone"
    assert sorted(answers) == [0, 1, 2, 3] and all(len(a) == STEPS for a in answers.values())
    # its answer is the one the prompt gives read alone (the tiny model in float32: no near ties)
    lone = BatchEngine(llm, Join(1))
    seq = lone.sequence()
    logits, out = seq.prefill(prompts[3]), []
    for _ in range(8):
        out.append(int(np.argmax(logits)))
        logits = seq.decode_step(out[-1])
    seq.free()
    assert answers[3][:8] == out


def _prompt_calls(llm, arrivals: int, stagger_s: float):
    """Four jobs' prompts reach the batch ``stagger_s`` apart, with ``arrivals`` of them announced
    first as the server announces the jobs it took (Join.expect) → for each llama_decode, the
    sequences whose prompt tokens it read."""
    from taskrun.pipelines.llm.llamacpp_batch import BatchEngine
    from taskrun.tasks import seq_batch
    from taskrun.tasks.seq_batch import Join

    join = Join(4)
    batch = BatchEngine(llm, join)
    calls: list[set[int]] = []
    fill = batch._fill

    def record(rows):
        calls.append({r[0] for r in rows})  # prompt rows only: no job here decodes
        fill(rows)

    batch._fill = record
    arrivals = [join.expect() for _ in range(arrivals)]
    prompts = [llm.prompt_ids(f"Story number {i}: once upon a time there was") for i in range(4)]

    def one(k: int) -> None:
        time.sleep(stagger_s * k)
        if k < len(arrivals):
            seq_batch.ARRIVAL.set(arrivals[k])
        seq = batch.sequence()
        seq.prefill(prompts[k])
        seq.free()

    _in_threads(one)
    assert join.coming == 0
    return [c for c in calls if c]


def test_prompts_of_jobs_on_their_way_are_read_in_one_pass(llm):
    """The server took four requests at once; their prompts reach the batch 10 ms apart (each
    job's thread renders and tokenizes its own). The first waits for the others (ARRIVE_S), and
    one llama_decode reads the four: 4 prompts of ~40 tokens on the 1.5B took 2.4-2.9 s in one
    pass, 3.3-3.6 s one a pass. Unannounced, the first is read alone after the 3 ms window."""
    together = _prompt_calls(llm, 4, 0.01)
    assert len(together) == 1 and together[0] == {0, 1, 2, 3}, together
    alone = _prompt_calls(llm, 0, 0.01)
    assert len(alone) > 1, alone


def test_a_job_announced_but_never_coming_holds_a_prompt_only_briefly(llm):
    """A job the server took that ends before it reaches the batch (its client left, a bad
    request) says so (Arrival.landed); one that is slow to come is waited for ARRIVE_S at most."""
    from taskrun.pipelines.llm.llamacpp_batch import ARRIVE_S, BatchEngine
    from taskrun.tasks.seq_batch import Join

    join = Join(4)
    batch = BatchEngine(llm, join)
    late = join.expect()  # never comes
    seq = batch.sequence()
    t0 = time.monotonic()
    seq.prefill(llm.prompt_ids("Once upon a time"))
    held = time.monotonic() - t0
    seq.free()
    assert ARRIVE_S * 0.8 <= held < ARRIVE_S + 1.0, held
    late.landed()
    late.landed()  # a second call changes nothing
    assert join.coming == 0 and batch._coming() == 0  # the next prompt is not held for it


def _greedy(batch, ids: list[int], n: int = 8) -> list[int]:
    import numpy as np

    seq = batch.sequence()
    logits, out = seq.prefill(ids), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = seq.decode_step(out[-1])
    seq.free()
    return out


def test_the_batch_runs_on_a_persistent_threadpool_and_answers_as_without_one(llm, monkeypatch):
    """llama-server's steady worker threads (pipelines/llm/llamacpp_pool.py) instead of one made
    per llama_decode: the process's one pool by default, off with TASKRUN_LLAMA_THREADPOOL=0, same
    tokens."""
    import os

    from taskrun.pipelines.llm import llamacpp_pool
    from taskrun.pipelines.llm.llamacpp_batch import BatchEngine
    from taskrun.tasks.seq_batch import Join

    ids = llm.prompt_ids("Story number 7: once upon a time")
    pooled = BatchEngine(llm, Join(2))
    with_pool = _greedy(pooled, ids)
    assert llamacpp_pool.SHARED.made.get(os.getpid()) is not None, "llama.cpp should offer ggml_threadpool_new"
    monkeypatch.setenv("TASKRUN_LLAMA_THREADPOOL", "0")
    plain = BatchEngine(llm, Join(2))
    assert _greedy(plain, ids) == with_pool
    assert _greedy(pooled, ids) == with_pool  # the context the pool served, detached from it
    del pooled, plain
