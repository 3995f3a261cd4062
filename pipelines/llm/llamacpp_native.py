"""llama.cpp below the engine (pipelines/llm/llamacpp.py): the library, one loaded model with its
context, thread counts, and the float16 copy of a 4-bit GGUF that reads prompts.

Why a prompt copy: llama.cpp reads a prompt (many tokens at once) through matrix-matrix kernels;
for Q4_1 and most other 4/5-bit formats on AVX2 there are none (each row is dotted on its own),
and the activations are rounded to 8 bits for every product. Float16 weights take llama.cpp's
tiled kernels (llamafile's sgemm) with float16 activations. Measured on SmolLM2-135M Q4_1
(benchmarks/bench_generate.py, interleaved, 1 thread): the prompt reads ~2x faster from a float16
copy, and its logits match the float32 model's (25.29/25.23 against 25.33/25.24 for the top two
answers to "What is the capital of France?", where the 4-bit pass gives 24.74/24.65 and flips the
tie to a wrong answer). One token at a time is fastest from the 4-bit file (fewer bytes to
stream), so the float16 copy reads the prompt and its KV cache moves to the 4-bit model's context
(``llama_state_seq_get/set_data``: ~3 ms for 120 tokens), which decodes. The copy holds the 4-bit
values exactly; llama.cpp's own quantizer (``llama_model_quantize``) writes it once per file
digest into the cache (~1-2 s for 135M parameters).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import threading
from collections import deque
from pathlib import Path

from taskrun.models.gguf import COPY_MAX_BYTES, copy_bytes, file_type, wants_prompt_copy  # noqa: F401 (their old home)
from taskrun.pipelines.llm.kv_state import copy_seq
from taskrun.pipelines.llm.llamacpp_pool import SHARED
from taskrun.tasks.base import TaskError

PIP = "llama-cpp-python==0.3.36"
INSTALL = (
    f'`make install` builds it; by hand: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON '
    f'-DGGML_F16C=ON" pip install {PIP}'
)
BATCH = 512  # prompt tokens per llama_decode call (and the largest ubatch llama.cpp plans for)
F16 = 1  # llama_ftype MOSTLY_F16

_LOG: deque[str] = deque(maxlen=40)  # llama.cpp's recent log lines, to explain a failure
_STATE: dict = {}  # the imported library and the log callback (which must outlive every call)


def library():
    """``llama_cpp``, imported once, its backend started and its log kept in ``_LOG`` (never on
    stderr: taskrun reports what matters itself)."""
    if "lib" in _STATE:
        return _STATE["lib"]
    from taskrun.pipelines.llm.llamacpp_kernels import select

    _STATE["build"] = select()  # the AVX-512 build where this CPU runs it (LLAMA_CPP_LIB_PATH)
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:
        raise TaskError(
            f"the llama.cpp runtime needs {PIP} ({exc}); {INSTALL}; or pick --runtime transformers"
        ) from None

    @llama_cpp.llama_log_callback
    def keep(level, text, user_data):
        _LOG.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _STATE.update(lib=llama_cpp, log=keep)
    return llama_cpp


# llama.cpp's CPU kernels, best first: (its system-info name, /proc/cpuinfo's flag). The library is
# chosen at run time (llamacpp_kernels: portable AVX2, or AVX-512 where the CPU has it), so a job's
# run log says which level ran, which build, and what this CPU has that it leaves unused (AMX).
_KERNEL_LEVELS = (
    ("AMX_INT8", "amx_int8"),
    ("AVX512_BF16", "avx512_bf16"),
    ("AVX512_VNNI", "avx512_vnni"),
    ("AVX512", "avx512f"),
    ("AVX_VNNI", "avx_vnni"),
    ("AVX2", "avx2"),
    ("AVX", "avx"),
    ("SSSE3", "ssse3"),
    ("SSE3", "pni"),
)


def kernel_level(system_info: str, cpu_flags: set[str] | None = None) -> str:
    """Which CPU kernel level the loaded llama.cpp library runs, from ``llama_print_system_info``
    ("CPU : SSE3 = 1 | AVX2 = 1 | ..."), and the levels this CPU has above it that the build does
    not use: the note `run bench` and the run log keep beside every llama.cpp rate."""
    built = {k.strip() for k, _, v in (p.partition("=") for p in system_info.split("|")) if v.strip() == "1"}
    built = {k.split(":")[-1].strip() for k in built}
    level = next((name for name, _ in _KERNEL_LEVELS if name in built), "generic")
    if cpu_flags is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                line = next((x for x in f if x.startswith("flags")), "")
        except OSError:
            line = ""
        cpu_flags = set(line.partition(":")[2].split())
    order = [name for name, _ in _KERNEL_LEVELS]
    unused = (
        [
            name
            for name, flag in _KERNEL_LEVELS
            if flag in cpu_flags and name not in built and order.index(name) < order.index(level)
        ]
        if level in order
        else []
    )
    note = f"llama.cpp CPU kernels: {level}"
    if unused:
        note += f" (this CPU also has {', '.join(unused)}, which this build does not use)"
    return note


def kernel_note() -> str:
    """``kernel_level`` for the llama.cpp library this process loaded."""
    if "kernels" not in _STATE:  # one library and one CPU per process: read once, not per job
        info = library().llama_print_system_info().decode("utf-8", "replace")
        _STATE["kernels"] = f"{kernel_level(info)}; {_STATE['build']}"
    return _STATE["kernels"]


def log_tail(errors_only: bool = False) -> str:
    lines = [x.strip() for x in _LOG if not errors_only or "error" in x.lower() or "fail" in x.lower()]
    return " ".join(lines)[-300:]


def decode_threads() -> int:
    """Threads for single-token steps: TASKRUN_DECODE_THREADS when set (0: every core), else the
    cores other processes leave free right now (free_threads), as for prompts. The engine asks again
    every RECHECK steps while it decodes (llamacpp.py), so a neighbour that starts mid-answer
    takes a thread away within a few hundred milliseconds.

    Measured on SmolLM2-135M Q4_1 on 2 cores (`run generate`, 128 tokens, interleaved): quiet,
    2 threads 95-105 tok/s against 65-80 on 1; beside one busy process, 2 threads 22-26 against
    62-72 on 1 (ggml's threads meet at a spinning barrier after every operation, and one of them
    waits for a core). Hence all free cores, and only those."""
    fixed = os.environ.get("TASKRUN_DECODE_THREADS", "").strip()
    if fixed:
        from taskrun.pipelines.device import cpu_threads

        n = int(fixed)
        return n if n > 0 else cpu_threads()
    return free_threads()


def prompt_threads() -> int:
    """Threads for reading a prompt: every core this process may use, less those other processes
    keep busy right now (free_threads; TASKRUN_THREADS overrides).

    ggml's worker threads meet at a spinning barrier after every operation; when another process
    holds one of the cores, each barrier waits for a descheduled thread. Measured on 2 cores beside
    busy neighbours (load ~9): 2 threads read a 120-token prompt 3-8x slower than 1 thread."""
    from taskrun.pipelines.device import cpu_threads

    if os.environ.get("TASKRUN_THREADS"):
        return cpu_threads()
    return free_threads()


def free_threads() -> int:
    """The cores this process may use that other processes leave free right now.

    "Right now" is pipelines/device.py's others_running: the threads of other processes the
    kernel counts runnable at this moment, the least of three looks 1 ms apart (~2 ms, not the
    default ~8). The machine's cores less those is what is free. The 1-minute load average, used
    only where that count is unknown, lags: a neighbour that stopped 30 s ago still counts in it,
    one that just started does not. Neither known: every core."""
    from taskrun.pipelines.device import cpu_count, cpu_threads, others_running

    cores = cpu_threads()
    others = others_running(looks=3, gap_s=0.001)
    if others is not None:
        return max(1, min(cores, cpu_count() - others))
    try:
        busy = os.getloadavg()[0]  # this process's own thread included, hence the + 1
    except (OSError, AttributeError):  # unknown, or not on this platform
        return cores
    return max(1, min(cores, cores - int(busy + 0.5) + 1))


def read_into_memory(lib, params) -> None:
    """Set llama.cpp to read the GGUF's weights into memory instead of mapping the file.

    A mapped file truncated or rewritten in place under a running process (``cp new.gguf
    model.gguf`` truncates first) kills it with SIGBUS on its next step through the weights
    (issue 33 item 11); read into memory, the loaded model no longer depends on the file. This
    llama.cpp has ``load_mode``/``lazy_mode`` where older ones had ``use_mmap``; setting a field a
    ctypes struct lacks is silently ignored, so the field is looked up, not assumed."""
    fields = {f[0] for f in type(params)._fields_}
    if "load_mode" in fields:
        params.load_mode = lib.LLAMA_LOAD_MODE_NONE
        if "lazy_mode" in fields:  # lazy reading needs a mapping
            params.lazy_mode = lib.LLAMA_LAZY_MODE_OFF
    elif "use_mmap" in fields:
        params.use_mmap = False
    else:
        raise TaskError(f"this llama.cpp ({PIP} expected) has no way to turn off mmap; reinstall it: {INSTALL}")


class Native:
    """One llama.cpp model and its context (KV cache), freed context first when the last engine
    holding it goes: copies of an engine share it, so a copy going away frees nothing in use.

    ``tokens`` are the ids whose KV the context holds (positions 0..pos-1), so that the next job
    can keep the prefix it shares with them (llamacpp.py, ``prefill``). They live here, beside the
    KV cache they describe, so engine copies sharing this context share one true view of it."""

    def __init__(self, lib, path: Path) -> None:
        self.lib, self.path = lib, path
        self.ctx, self.mem, self.n_ctx = None, None, 0
        self.n_threads = self.n_batch_threads = 1  # llama.cpp's threads for one token, and for many
        self.tokens: list[int] = []
        # (n, logits) after the last prompt read: n prompt tokens and the logits that followed them,
        # valid while tokens[:n] is that prompt's KV as it was read (keep() and clear() drop it)
        self.prompt_end: tuple[int, object] | None = None
        self.scope: str | None = None  # whose prompt the KV cache holds (tasks/cache_scope.py; None: nobody's)
        # held while a prompt is read on this context for another (the float16 prompt copy serves
        # the engine's own context and its batch's slots: pipelines/llm/llamacpp*.py)
        self.lock = threading.Lock()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        read_into_memory(lib, params)
        _LOG.clear()
        self.model = lib.llama_model_load_from_file(str(path).encode(), params) or None
        if self.model is None:
            raise TaskError(
                f"llama.cpp could not load {path} ({log_tail(True) or 'no reason given'}); "
                f"re-download the file, or try --runtime transformers"
            )

    def ensure(self, size: int) -> None:
        """A context with room for ``size`` tokens (made anew, empty, when the current one is smaller)."""
        if self.ctx is not None and size <= self.n_ctx:
            return
        lib = self.lib
        self.free_context()
        p = lib.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = size, BATCH, BATCH, 1
        self.n_threads = decode_threads()
        p.n_threads, p.n_threads_batch, p.no_perf = self.n_threads, prompt_threads(), True
        _LOG.clear()
        self.ctx = lib.llama_init_from_model(self.model, p) or None
        if self.ctx is None:
            raise TaskError(
                f"llama.cpp could not make a {size}-token context for {self.path.name} "
                f"({log_tail()}); free memory or shorten the job"
            )
        self.mem, self.n_ctx = lib.llama_get_memory(self.ctx), lib.llama_n_ctx(self.ctx)
        self.n_batch_threads = p.n_threads_batch
        self.tokens, self.prompt_end = [], None

    @property
    def pos(self) -> int:
        """The next position: how many tokens the KV cache holds."""
        return len(self.tokens)

    def clear(self) -> None:
        if self.mem is not None:
            self.lib.llama_memory_clear(self.mem, False)
        self.tokens, self.prompt_end = [], None

    def keep(self, n: int) -> bool:
        """Drop the KV cache after its first ``n`` positions; False if llama.cpp cannot (a
        recurrent model's state cannot be cut): the caller then starts over with ``clear``.
        Called even with nothing to drop: a batch interrupted (Ctrl-C) after llama_decode but
        before ``tokens`` grew left positions that the next batch would otherwise follow."""
        if not self.lib.llama_memory_seq_rm(self.mem, 0, n, -1):
            return False
        del self.tokens[n:]
        if self.prompt_end is not None and self.prompt_end[0] > n:
            self.prompt_end = None
        return True

    def eval(self, arr, n: int):
        """Append the ``n`` tokens of the ctypes array ``arr``; a pointer to the logits after the last."""
        lib = self.lib
        if self.pos + n > self.n_ctx:
            raise TaskError(
                f"the sequence outgrew its {self.n_ctx}-token KV cache; this is a bug in "
                f"the caller's room estimate (report it)"
            )
        if n > 1:
            self.n_batch_threads = prompt_threads()
            lib.llama_set_n_threads(self.ctx, self.n_threads, self.n_batch_threads)
        for start in range(0, n, BATCH):
            k = min(BATCH, n - start)
            part = arr if k == n else (lib.llama_token * k).from_buffer(arr, start * ctypes.sizeof(lib.llama_token))
            with SHARED.on(lib, self.ctx, single=True):  # ggml's per-call threads unless =all
                rc = lib.llama_decode(self.ctx, lib.llama_batch_get_one(part, k))
            if rc != 0:
                # what llama.cpp kept of a failed batch is unknown: the next job starts over
                self.clear()
                raise TaskError(f"llama.cpp failed to evaluate {k} tokens (llama_decode returned {rc})")
            self.tokens.extend(part[:k])
        return lib.llama_get_logits_ith(self.ctx, -1)

    def decode_on(self, n: int) -> None:
        """Single-token steps on ``n`` threads from now on (prompts keep theirs)."""
        if self.ctx is not None and n != self.n_threads:
            self.lib.llama_set_n_threads(self.ctx, n, self.n_batch_threads)
            self.n_threads = n

    def move_kv_to(self, other: Native) -> bool:
        """Hand this context's sequence (its KV cache) to ``other``, whose model has the same shape."""
        other.clear()
        if not copy_seq(self.lib, self.ctx, 0, other.ctx, 0):
            other.clear()
            return False
        other.tokens = self.tokens
        self.clear()
        return True

    def free_context(self) -> None:
        if self.ctx is not None:
            self.lib.llama_free(self.ctx)
            self.ctx, self.mem, self.n_ctx = None, None, 0
        self.tokens, self.prompt_end = [], None

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        # Bound as a default: at interpreter exit module globals (sys, the library's functions) may
        # already be None; the OS frees everything then anyway.
        if _finalizing():
            return
        self.free_context()
        if getattr(self, "model", None):
            self.lib.llama_model_free(self.model)
            self.model = None


def prompt_copy(lib, path: Path, digest: str) -> Path | None:
    """The float16 copy of ``path`` in the cache, made now if missing; CopyRefused (an OSError)
    saying why where it cannot be (too little room on the cache disk, llama.cpp failed)."""
    from taskrun.models.resolve import cache_dir

    folder = cache_dir() / "llamacpp"
    target = folder / f"{digest.replace('sha256:', '')[:32]}.f16.gguf"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    need = copy_bytes(path)
    free = shutil.disk_usage(folder).free
    if free < need:  # llama.cpp's quantizer would fail part-way, saying nothing we could pass on
        raise CopyRefused(
            f"the float16 prompt copy of {path.name} needs {need / 1e6:.0f} MB and {folder} has "
            f"{free / 1e6:.0f} MB free, so prompts were read from the 4-bit weights (the answer can "
            f"differ); free space there or set TASKRUN_CACHE_DIR, or TASKRUN_PROMPT_COPY=0 to silence this"
        )
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # a crash never leaves half a file
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.quantize_output_tensor = F16, True, True
    from taskrun.pipelines.device import cpu_threads

    params.nthread = cpu_threads()
    _LOG.clear()
    try:
        ok = lib.llama_model_quantize(str(path).encode(), str(tmp).encode(), ctypes.byref(params)) == 0
        if ok:
            os.replace(tmp, target)
            from taskrun.models.cache_record import note_written

            note_written(target, cache_dir())
    finally:
        tmp.unlink(missing_ok=True)
    if not ok:
        raise CopyRefused(
            f"llama.cpp could not write the float16 prompt copy of {path.name} into {folder} "
            f"({log_tail(True) or 'no reason given'}), so prompts were read from the 4-bit weights "
            f"(the answer can differ); TASKRUN_PROMPT_COPY=0 to silence this"
        )
    return target


class CopyRefused(OSError):
    """No float16 prompt copy could be made; the message says why and what it changes (a job note)."""
