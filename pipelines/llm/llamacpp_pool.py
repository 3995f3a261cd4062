"""One persistent ggml threadpool for the server's batch contexts, as llama-server runs.

Why: a context without one makes a *disposable* threadpool inside every ``llama_decode``
(ggml-cpu.c, ``ggml_graph_compute``): a new worker thread per call, which the kernel places
beside the calling thread and moves away only later. Measured in one process on the 1.5B Q4_K_M
(AVX-512 build, 2 cores, 41-token prompt, 6 alternated rounds): prompt reads took 428-709 ms with
the disposable pool (bimodal: ~440 or ~570) and 422-436 ms with a persistent one, polling as
llama-server's does (``poll`` 50); 4-row decode steps 86.7 against 86.4 ms. llama-server's own
``prompt_ms`` on the same prompt was 428-460 ms. On a Zen 3 (AVX2) host the single-stream engine
showed no difference either way beyond that host's noise (benchmarks/bench_threadpool.py).

Why one pool and not one a context: after each graph a pool's workers poll for the next one
(measured: ~0.2 s of a core after the last step), so two pools would spin against each other (two
models' batches in one server). The single-stream contexts keep ggml's per-call threads unless
TASKRUN_LLAMA_THREADPOOL=all (``Shared``, why).

The pool is sized to the cores this process may use; llama.cpp runs each graph on
``min(its n_threads, the pool's)`` of them, so ``llama_set_n_threads`` keeps working.
TASKRUN_LLAMA_THREADPOOL=0 turns it off (the disposable pool, as before).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import deque
from contextlib import contextmanager
from pathlib import Path

POLL = 50  # ggml's default and llama-server's: workers spin a while for the next graph before sleeping


class _Params(ctypes.Structure):  # struct ggml_threadpool_params (ggml.h)
    _fields_ = [
        ("cpumask", ctypes.c_bool * 512),  # GGML_MAX_N_THREADS
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


def _cpu_library(llama_cpp):
    """libggml-cpu as the process loaded it (the folder libllama came from), or None."""
    folder = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    for name in ("libggml-cpu.so.0", "libggml-cpu.so", "libggml-cpu.dylib"):
        if (folder / name).exists():
            try:
                return ctypes.CDLL(str(folder / name))
            except OSError:
                return None
    return None


def _new(llama_cpp):
    """A new pool of this process's cores and the library's attach call → ((cpu, pool), attach),
    or None where the library lacks the calls (the disposable pool then)."""
    cpu = _cpu_library(llama_cpp)
    attach_fn = getattr(getattr(llama_cpp, "llama_cpp", llama_cpp)._lib, "llama_attach_threadpool", None)
    if cpu is None or attach_fn is None or not hasattr(cpu, "ggml_threadpool_new"):
        return None
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    params = _Params()
    params.n_threads, params.poll = n, POLL  # no affinity mask, normal priority, not paused
    cpu.ggml_threadpool_new.restype, cpu.ggml_threadpool_new.argtypes = ctypes.c_void_p, [ctypes.POINTER(_Params)]
    pool = cpu.ggml_threadpool_new(ctypes.byref(params))
    if not pool:
        return None
    attach_fn.restype, attach_fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return (cpu, pool), attach_fn


class FairLock:
    """A lock handed to its waiters in the order they came. threading.Lock is not: a thread that
    releases it and asks again at once, as a prompt read does between its 512-token calls, takes it
    back before a woken waiter runs. Measured on 2 busy cores with a 2 ms C call that releases the
    GIL as ``llama_decode`` does: a waiter got in after 0-130 more calls of the other thread's
    (median 45 of 15 tries), so the server's batch could wait out most of a long prompt. Released,
    this one goes straight to the longest waiter. A waiter interrupted (Ctrl-C) leaves the queue,
    or passes the lock on when it was handed it meanwhile."""

    _turn = threading.Event  # a waiter's signal (a test interrupts one)

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._held = False

    def __enter__(self) -> FairLock:
        with self._mutex:
            if not self._held:
                self._held = True
                return self
            turn = self._turn()
            self._waiting.append(turn)
        try:
            turn.wait()
        except BaseException:
            with self._mutex:
                if turn in self._waiting:  # not handed over yet: leave the queue
                    self._waiting.remove(turn)
                    raise
            self.__exit__()  # handed over meanwhile: pass it on
            raise
        return self

    def __exit__(self, *exc) -> None:
        with self._mutex:
            if self._waiting:
                self._waiting.popleft().set()  # still held: now by the longest waiter
            else:
                self._held = False


class Shared:
    """The process's pool, attached to a context just before each of its ``llama_decode`` calls
    and held for the call under one lock: every batch context of the server (one a model), and
    with TASKRUN_LLAMA_THREADPOOL=all the single-stream ones too (a model's, its float16 prompt
    copy's, a draft's).

    Why not the single-stream ones by default: on a Zen 3 host they were level either way
    (benchmarks/bench_threadpool.py), and the pool's worker polls ~0.2 s of a core after each
    graph, where ggml's per-call threads end with it. Beside a second busy process that polling
    takes the core the other needs: with the single-stream engine on the pool, a test run on 2
    workers (pytest -n 2) failed the adaptive draft's timing test.

    Why the lock: a ggml pool runs one graph at a time, and two contexts computing at once on the
    same cores would only take turns at ggml's barriers (docs/language-models.md); the lock is
    taken around ``llama_decode`` alone, never with another lock inside it, and handed on in
    arrival order (FairLock). Attaching is a pointer llama.cpp reads at each graph
    (``llama_context::graph_compute``), so it costs nothing a call. With
    TASKRUN_LLAMA_THREADPOOL=0 nothing is attached and nothing is locked."""

    def __init__(self) -> None:
        self.lock = FairLock()
        self.made: dict[int, object] = {}  # pid → _new's answer: a pool's workers do not survive fork

    @contextmanager
    def on(self, llama_cpp, ctx, single: bool = False):
        """Run the block (one ``llama_decode`` on ``ctx``, a single-stream context's where
        ``single``) on the shared pool, or where the pool is not for it on ggml's per-call threads."""
        mode = os.environ.get("TASKRUN_LLAMA_THREADPOOL", "1")
        if mode == "0" or (single and mode != "all"):
            if self.made.get(os.getpid()) is not None:  # a pool exists: ctx may have been attached to it
                detach = getattr(llama_cpp, "llama_cpp", llama_cpp)._lib.llama_detach_threadpool
                detach.restype, detach.argtypes = None, [ctypes.c_void_p]
                detach(ctx)  # back to ggml's per-call threads
            yield
            return
        with self.lock:
            pid = os.getpid()
            if pid not in self.made:
                self.made = {pid: _new(llama_cpp)}
            made = self.made[pid]
            if made is not None:
                (_, handle), attach_fn = made
                attach_fn(ctx, handle, handle)
            yield


SHARED = Shared()
