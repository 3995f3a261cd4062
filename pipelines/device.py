"""Threads, devices and dtypes: the one place that sets them, for every pipeline.

OpenMP waits passively (a busy neighbour process must not collapse throughput), token-by-token
loops run on one thread, and ``auto`` dtypes pick bf16 only where the CPU has bf16 matrix units
and the pipeline has checked that accuracy holds.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

from taskrun.tasks.base import TaskError

_CONFIGURED = False


def configure_openmp() -> None:
    """Passive OpenMP waits, for every OpenMP runtime this process loads (torch's, CTranslate2's
    own libgomp): each reads OMP_WAIT_POLICY once, when it loads, so call this before importing it.

    Spinning worker threads steal each other's cores on a small machine shared with another busy
    process, and torch slows 10-60x; a passive wait costs little on a quiet machine. Torch-free, so
    a runtime that never uses torch (CTranslate2) does not pay for importing it (measured on
    whisper-tiny.en: load_s 0.9-1.1 s without torch, 6.7-6.8 s with it).
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# CTranslate2's libgomp spins this many times before it sleeps (libgomp's GOMP_SPINCOUNT; passive
# is 0, libgomp's own default 300,000). Measured on `run bench transcribe`'s meeting, each setting
# in a process of its own (benchmarks/README.md, "CTranslate2 spins briefly"): 1,000 spins ran 1.30-1.44x faster
# than passive waits on a quiet machine (2.04 vs 2.95 s) and 2-13 % slower beside one busy process
# (3.73 vs 3.65 s), where 10,000 already collapsed (7.19 s); so it is used only where a core is
# free for each thread (ct2_spincount). Torch's libgomp stays passive: there the same spin gained
# nothing (image, generate) or lost (classify on torch).
CT2_SPINCOUNT = "1000"


def others_running(looks: int = 5, gap_s: float = 0.002) -> int | None:
    """How many threads of other processes are running or waiting for a core right now: the
    kernel's count of runnable threads (/proc/loadavg's fourth field) less this process's own
    runnable ones (an audio reader thread of this job is not a busy machine), the least of a few
    looks ~2 ms apart (nor is a passing process). None where unknown."""
    import time

    seen = []
    try:
        for i in range(looks):
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
            seen.append(running - _own_running())
            if i + 1 < looks:
                time.sleep(gap_s)
    except (OSError, ValueError, IndexError):
        return None
    return max(0, min(seen))


def _own_running() -> int:
    """This process's threads that are running or runnable (state R in /proc/self/task/*/stat);
    at least 1, the one asking."""
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rindex(")") + 2] == "R":  # the field after "(name)"; a name may hold spaces
            n += 1
    return max(1, n)


def ct2_spincount() -> str:
    """CTranslate2's spin count for this process: TASKRUN_CT2_SPINCOUNT when set, else
    CT2_SPINCOUNT on a machine with a core free for each of its threads, and 0 (passive) when
    other threads keep a core busy as it loads: there a spinning thread waits for a descheduled
    partner (measured beside one busy process: 3.73-3.75 s against 3.31-3.65 s passive). The
    choice is made once, when CTranslate2 loads."""
    return _ct2_spin_choice()[0]


def _ct2_spin_choice() -> tuple[str, str]:
    """(spin count, why): ct2_spincount and the reason the run log gives for it."""
    if os.environ.get("TASKRUN_CT2_SPINCOUNT"):
        return os.environ["TASKRUN_CT2_SPINCOUNT"], "TASKRUN_CT2_SPINCOUNT"
    others = others_running()
    if others is None:
        return CT2_SPINCOUNT, "the machine's load is unknown here"
    if others == 0 or cpu_count() - others >= cpu_threads():
        return CT2_SPINCOUNT, f"{_threads(others)} of other processes running as it loaded"
    return "0", f"{_threads(others)} of other processes running as it loaded, too few cores free to spin on"


def _threads(n: int) -> str:
    return "no threads" if n == 0 else f"{n} thread" + ("s" if n > 1 else "")


# How this process's CTranslate2 threads wait, set when it is imported: the wait changes its speed
# 1.3x, so each transcription's run log says which one it ran with (ct2_wait_note).
_CT2_WAIT: tuple[str, str] | None = None


def ct2_wait_note() -> str | None:
    """A line for the run log: how CTranslate2's threads wait in this process and why (None
    before ctranslate2 is imported through import_ctranslate2)."""
    if _CT2_WAIT is None:
        return None
    spin, why = _CT2_WAIT
    if spin == "?":
        return f"CTranslate2's threads wait as its libgomp was set when it loaded ({why})"
    if spin in ("", "0"):
        how = "wait passively"
    elif spin.isdigit():
        how = f"spin {int(spin):,} times before sleeping"
    else:  # libgomp also reads counts such as 10k or "infinite"
        how = f"spin as GOMP_SPINCOUNT={spin} says"
    return f"CTranslate2's threads {how} ({why})"


def cpu_count() -> int:
    """The cores of the machine (not only those this process may use): what other processes share."""
    return os.cpu_count() or 1


def import_ctranslate2():
    """``ctranslate2``, imported with its own libgomp spinning briefly (ct2_spincount) while
    every other OpenMP runtime waits passively. libgomp reads GOMP_SPINCOUNT once, when it loads,
    and torch's libgomp reads the same variable: so it is set only for this import and removed
    after. A GOMP_SPINCOUNT of the user's own is left alone; TASKRUN_CT2_SPINCOUNT sets the count
    (0: passive waits, as for torch)."""
    # One import at a time: a batch actor's threads load their engines together, and a second
    # thread that took ctranslate2 from sys.modules mid-import got a partly initialised module.
    with _CT2_IMPORT_LOCK:
        return _import_ctranslate2()


_CT2_IMPORT_LOCK = threading.Lock()


def _import_ctranslate2():
    global _CT2_WAIT
    if "ctranslate2" in sys.modules:
        if _CT2_WAIT is None:  # imported by other code first: its libgomp read whatever was set then
            _CT2_WAIT = ("?", "ctranslate2 was imported before taskrun chose how its threads wait")
        import ctranslate2  # waits on Python's module lock if another thread is still importing it

        return ctranslate2
    configure_openmp()
    ours = "GOMP_SPINCOUNT" not in os.environ
    spin, why = _ct2_spin_choice() if ours else (os.environ["GOMP_SPINCOUNT"], "your GOMP_SPINCOUNT")
    _CT2_WAIT = (spin, why)
    ours = ours and spin not in ("", "0")
    if ours:
        os.environ["GOMP_SPINCOUNT"] = spin
    try:
        import ctranslate2
    finally:
        if ours:
            os.environ.pop("GOMP_SPINCOUNT", None)
    return ctranslate2


def configure_threads() -> None:
    """Set torch's threading deliberately, before torch starts its thread pool.

    Passive OpenMP waits (configure_openmp); TASKRUN_THREADS sets the count; the libraries' own
    load bars are silenced (taskrun draws its own progress).
    """
    global _CONFIGURED
    if _CONFIGURED:
        return
    configure_openmp()
    import torch

    n = os.environ.get("TASKRUN_THREADS")
    if n:
        torch.set_num_threads(int(n))
    try:  # taskrun draws its own progress on stderr; the libraries' load bars are noise there
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    _CONFIGURED = True


def cpu_threads() -> int:
    """TASKRUN_THREADS, else every core this process may use (for runtimes with their own pool,
    such as CTranslate2, which defaults to 4)."""
    env = os.environ.get("TASKRUN_THREADS")
    if env:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def torch_threads(n: int | None):
    """Run a block with ``n`` intra-op threads (None or 0: leave torch's setting), then restore it.
    Where torch is not loaded (a greedy decode on llama.cpp) there is nothing to set, and it is
    not imported for this (~2 s)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    switch = bool(n) and n != before
    if switch:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if switch:
            torch.set_num_threads(before)


def decode_threads(device: str):
    """Run token-by-token decoding on one CPU thread (TASKRUN_DECODE_THREADS overrides).

    A decode step is hundreds of tiny ops; with passive OpenMP waits each one pays a thread
    wake-up, and with spinning waits a busy neighbour process steals the spinning core. Measured
    on SmolLM2-135M on 2 cores (benchmarks/bench_generate.py): 2 passive threads 36 tok/s quiet,
    45 busy; 1 thread 56 quiet, 54 busy; 2 spinning threads 64 quiet, 22 busy. Prefill is
    compute-bound and keeps all threads.
    """
    n = int(os.environ.get("TASKRUN_DECODE_THREADS", "1"))
    return torch_threads(n if device == "cpu" and n > 0 else None)


def resolve_device(device: str) -> str:
    configure_threads()
    import torch

    if device in ("auto", "", None):
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TaskError(f"--device {device} asked for, but torch sees no CUDA device here; use --device cpu")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise TaskError("--device mps asked for, but MPS is not available here; use --device cpu")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise TaskError(f"unknown device '{device}'; use auto, cpu, cuda, cuda:N or mps")
    return device


def cpu_has_bf16() -> bool:
    """True where the CPU has bf16 matrix instructions (AMX / AVX512-BF16), so bf16 is fast."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(dtype: str, device: str, auto: str = "float32"):
    """The torch dtype for ``dtype`` ("auto", "float32", "bfloat16", "float16"); ``auto`` is the
    pipeline's measured best choice for this device."""
    import torch

    name = auto if dtype in ("auto", "", None) else dtype
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise TaskError(f"unknown dtype '{dtype}'; use auto, float32, bfloat16 or float16")
    if name == "float16" and device == "cpu":
        raise TaskError("float16 is slow or unsupported on CPU; use --dtype bfloat16 or float32")
    return table[name], name


def auto_dtype(device: str, prefer_bf16: bool) -> str:
    """bf16 where it is fast and the pipeline has checked that accuracy holds, else float32."""
    if not prefer_bf16:
        return "float32"
    if device.startswith("cuda"):
        return "bfloat16"
    if device == "cpu" and cpu_has_bf16():
        return "bfloat16"
    return "float32"


def require_cpu_float32(what: str, device: str, dtype: str, instead: str) -> None:
    """Refuse a --device or --dtype that a CPU-only float32 runtime (the ONNX Runtime engines)
    cannot honour, naming the runtime that can: ``what`` is "the onnxruntime runtime for classify"."""
    from taskrun.tasks.base import TaskError

    if device not in ("auto", "cpu", "", None):
        raise TaskError(f"{what} runs on the CPU; for --device {device} use --runtime {instead}")
    if dtype not in ("auto", "float32", "", None):
        raise TaskError(f"{what} runs float32; for --dtype {dtype} use --runtime {instead}")


def transpose_head(model) -> None:
    """A language model's vocabulary head (hidden size -> vocabulary) in the layout the CPU reads
    fastest: ``model``'s output embeddings replaced by ``x @ w_t`` (+ bias) over a transposed copy
    of the weight. A head tied to the token embedding shares that copy: the embedding then reads
    it as a strided view, so memory still holds one copy.

    On a CPU in float32, ``F.linear(x, w)`` with the head's weight as stored ([vocabulary,
    hidden]) is MKL's slow path for one row or a few; ``x @ w_t`` is not. Measured on 2 AVX2
    cores (AMD EPYC, torch 2.13 with MKL), one row: Whisper tiny.en's 51,864 x 384 head 5.9 ->
    2.2 ms, SmolLM2's 49,152 x 576 7.3 -> 4.3 ms, a Qwen2.5-0.5B-sized 151,936 x 896 head 30.8 ->
    21.2 ms. A layer's other projections gain nothing that way or lose, so only the head changes.
    Used by the transformers runtimes of transcribe and generate."""
    import torch

    class Head(torch.nn.Module):
        def __init__(self, w_t, bias) -> None:
            super().__init__()
            self.w_t, self.bias = w_t, bias

        def forward(self, x):
            y = x @ self.w_t
            return y if self.bias is None else y + self.bias

    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    w_t = head.weight.detach().t().contiguous()
    if embed is not None and embed.weight.data_ptr() == head.weight.data_ptr():
        embed.weight = torch.nn.Parameter(w_t.t(), requires_grad=False)
    model.set_output_embeddings(Head(w_t, head.bias))
