"""The lock the process's llama.cpp threadpool is held under (pipelines/llm/llamacpp_pool.py,
FairLock): handed on in arrival order, so a thread that releases it and asks again at once (a long
prompt read, call after call) cannot keep it from a waiter (the server's batch step), and a waiter
interrupted while it waits neither deadlocks the others nor keeps the lock."""

from __future__ import annotations

import threading
import time

import pytest

from taskrun.pipelines.llm.llamacpp_pool import SHARED, FairLock


def _until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def test_the_pools_lock_is_fair():
    assert isinstance(SHARED.lock, FairLock)


def test_a_thread_asking_again_at_once_comes_after_the_waiter():
    """threading.Lock fails this: the releasing thread takes it back before the woken waiter runs."""
    lock, order = FairLock(), []
    lock.__enter__()  # the prompt read, in one of its calls

    def batch_step():
        with lock:
            order.append("batch step")

    t = threading.Thread(target=batch_step)
    t.start()
    _until(lambda: len(lock._waiting) == 1)
    lock.__exit__()  # the call ends...
    with lock:  # ...and the next one asks at once
        order.append("prompt read")
    t.join(5)
    assert order == ["batch step", "prompt read"]


def test_waiters_get_the_lock_in_the_order_they_came():
    lock, order = FairLock(), []
    lock.__enter__()
    threads = []
    for i in range(4):

        def wait(i=i):
            with lock:
                order.append(i)

        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
        _until(lambda i=i: len(lock._waiting) == i + 1)  # queued before the next one starts
    lock.__exit__()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3]
    with lock:  # free again, and takeable at once
        pass


def test_an_interrupted_waiter_leaves_the_queue_and_the_lock_goes_on():
    lock = FairLock()

    class Interrupted(threading.Event):
        def wait(self, timeout=None):
            raise KeyboardInterrupt

    lock.__enter__()
    lock._turn = Interrupted
    with pytest.raises(KeyboardInterrupt):
        lock.__enter__()  # waits behind the holder, interrupted: out of the queue
    assert not lock._waiting
    lock._turn = threading.Event
    lock.__exit__()
    got = []
    t = threading.Thread(target=lambda: got.append(lock.__enter__()))
    t.start()
    t.join(5)
    assert got, "the lock was left held by the interrupted waiter"
    lock.__exit__()


def test_a_waiter_handed_the_lock_as_it_is_interrupted_passes_it_on():
    lock = FairLock()

    class HandedThenInterrupted(threading.Event):
        def wait(self, timeout=None):
            lock.__exit__()  # the holder releases: this waiter is handed the lock...
            assert self.is_set()
            raise KeyboardInterrupt  # ...and is interrupted before it returns

    lock.__enter__()
    lock._turn = HandedThenInterrupted
    with pytest.raises(KeyboardInterrupt):
        lock.__enter__()
    lock._turn = threading.Event
    assert not lock._held and not lock._waiting  # passed on: free, nobody else waiting
