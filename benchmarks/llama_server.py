"""llama.cpp's own server (`llama-server`) as a reference contender for the serve benchmarks.

The reference is built outside the repository from the llama.cpp that llama-cpp-python 0.3.36
vendors (so both run the same ggml kernels), with the portable flags `make install` gives the
wheel (Makefile, LLAMA_CMAKE: AVX/AVX2/FMA/F16C, no native, no OpenMP)::

    cd /work/ext && pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps -d .
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \\
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TOOLS=ON \\
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF \\
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    cmake --build build --target llama-server -j2      # -> build/bin/llama-server

Where taskrun runs its AVX-512 build (pipelines/llm/llamacpp_kernels.py; the run log says which), the
like-with-like reference is a second build with that level's flags added (5.6 min wall on 2 cores,
2026-12-04)::

    cmake -B build-avx512 <the flags above> -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON \
        -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
    cmake --build build-avx512 --target llama-server -j2

Started here the way taskrun's `run serve` is in the benchmarks: 127.0.0.1, the same GGUF, the
same threads for one token and for prompts (``-t``/``-tb``), ``--parallel N`` slots of 4096
tokens each (``-c`` = N x 4096, ``--no-kv-unified``: one KV cache per sequence, as taskrun's
batch context, pipelines/llm/llamacpp_batch.py), no host prompt cache (``--cache-ram 0``) and
every request sent with ``cache_prompt: false`` (taskrun runs with ``--prompt-cache off``), flash
attention left at llama.cpp's default (auto) on both.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

SLOT_CTX = 4096  # tokens per slot: taskrun's batch context per sequence (llamacpp_batch.SEQ_CTX)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc, name: str, timeout: float, log=lambda: "") -> None:
    """Until ``url``/health answers 200; an error (with the end of ``log()``) if ``proc`` exits first."""
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}:\n{log()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{name} did not start")


class LlamaServer:
    """One llama-server process on 127.0.0.1 serving ``gguf`` with ``parallel`` slots."""

    def __init__(
        self, binary: Path, gguf: Path, folder: Path, parallel: int, threads: int, extra: tuple = (), name: str = ""
    ) -> None:
        """``extra``: more llama-server arguments (a draft model); ``name`` tells its log apart."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / f"llama-server-{parallel}{name}.log"
        self.log = open(self.log_path, "wb")
        self.cmd = [
            str(binary),
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-c",
            str(parallel * SLOT_CTX),
            "--parallel",
            str(parallel),
            "--no-kv-unified",
            "--cache-ram",
            "0",
            "--no-webui",
            "--alias",
            "bench-llm",
            *extra,
        ]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 180) -> None:
        wait_healthy(self.url, self.proc, "llama-server", timeout, lambda: self.log_path.read_text(errors="replace"))

    def system_info(self) -> str:
        """llama.cpp's system info ("CPU : SSE3 = 1 | AVX2 = 1 | ..."): from the server's log where
        it printed one (this version does not at its default verbosity), else from the build's
        libllama beside the binary, asked in a process of its own (not this one's llama.cpp)."""
        m = re.search(r"system_info:[^\n]*", self.log_path.read_text(errors="replace"))
        if m:
            return m.group(0)
        lib = Path(self.cmd[0]).resolve().parent / "libllama.so"
        code = (
            "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "lib.llama_print_system_info.restype = ctypes.c_char_p; "
            "print(lib.llama_print_system_info().decode())"
        )
        try:
            p = subprocess.run([sys.executable, "-c", code, str(lib)], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return p.stdout.strip()

    def version(self) -> str:
        try:
            p = subprocess.run(self.cmd[:1] + ["--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        return " ".join((p.stdout + p.stderr).split())[-200:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
