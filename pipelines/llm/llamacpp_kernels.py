"""Which llama.cpp library a process loads: the portable one llama-cpp-python installs (AVX2), or
an AVX-512 build of llama.cpp's CPU backend that `make install` adds beside it, chosen at run time
from this CPU's flags, before ``import llama_cpp``.

Why two levels and not ggml's all-variants build (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, measured
in docs/language-models.md): its scoring picks the AMX variant on hosts whose CPU says AMX and whose
hypervisor does not enable it (SIGILL), it triples the build, and llama-cpp-python does not install
it. The AVX-512 level here is AVX-512 F/CD/VL/DQ/BW + VBMI + VNNI + BF16 (ggml's ``zen4`` set, which
Sapphire Rapids also has), no AMX: measured 1.40-1.84x prefill, 1.00-1.08x decode on a Zen 4
host (benchmarks/bench_llama_kernels.py --lib), and the same accepted eval answers; it rounds
differently, so near-tied greedy tokens can differ (benchmarks/bench_kernel_answers.py). Only
``libggml-cpu`` differs: the folder holds copies of the installed libllama/libggml/libggml-base,
and is used only while the installed libllama is the one it was built beside (a reinstalled
llama-cpp-python falls back to its own).

TASKRUN_LLAMA_KERNELS: ``auto`` (default), ``portable`` (never the AVX-512 build), or ``avx512``
(that build, or an error saying why not). A LLAMA_CPP_LIB_PATH set by the user is left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.util import find_spec
from pathlib import Path

from taskrun.tasks.base import TaskError

# (name, the /proc/cpuinfo flags its compiler flags need, its ggml CMake options), best first.
LEVELS = (
    (
        "avx512",
        "sse4_2 avx fma f16c avx2 bmi2 avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni avx512_bf16",
        "-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON",
    ),
)
# As the Makefile's LLAMA_CMAKE for the wheel (its options must match: one ABI), plus the level's.
BASE_CMAKE = (
    "-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON "
    "-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF "
    "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF"
)
COPIED = ("libllama.so.0", "libggml.so.0", "libggml-base.so.0")  # from the installed package, as is
MANIFEST = "taskrun-kernels.json"


def root() -> Path:
    """Where `make install` puts the levels: inside the environment, removed with it."""
    return Path(os.environ.get("TASKRUN_LLAMA_KERNEL_DIR") or Path(sys.prefix) / "lib" / "taskrun-llama")


def installed_lib() -> Path | None:
    spec = find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        line = ""
    return set(line.partition(":")[2].split())


def _built_for(folder: Path) -> str | None:
    try:
        return json.loads((folder / MANIFEST).read_text())["libllama"]
    except (OSError, ValueError, KeyError, TypeError):  # a half-written or foreign folder: not ours to load
        return None


def choose(flags: set[str], where: Path, lib: Path | None, want: str = "auto") -> tuple[Path | None, str]:
    """The best level this CPU runs whose folder under ``where`` matches the installed library
    ``lib``, and why: (folder or None for the portable library, a note for the run log)."""
    if want == "portable":
        return None, "portable build (TASKRUN_LLAMA_KERNELS=portable)"
    names = [name for name, _, _ in LEVELS]
    if want not in ("auto", *names):
        raise TaskError(f"TASKRUN_LLAMA_KERNELS={want!r}: use auto, portable or one of {', '.join(names)}")
    why = []
    for name, needs, _ in LEVELS:
        if want not in ("auto", name):
            continue
        missing = sorted(set(needs.split()) - flags)
        folder = where / name
        if missing:
            why.append(f"{name}: this CPU lacks {', '.join(missing)}")
        elif not (folder / MANIFEST).exists():
            why.append(f"{name}: not built (make install builds it into {where})")
        elif lib is None or _built_for(folder) != digest(lib / "libllama.so"):
            why.append(f"{name}: built for another llama-cpp-python (make install rebuilds it)")
        else:
            return folder, f"taskrun's {name} build, chosen from /proc/cpuinfo"
    if want != "auto":
        raise TaskError(f"TASKRUN_LLAMA_KERNELS={want}: {'; '.join(why)}; or set TASKRUN_LLAMA_KERNELS=auto")
    return None, "portable build" + (f" ({'; '.join(why)})" if why else "")


def wanted() -> str:
    """The level TASKRUN_LLAMA_KERNELS asks for (auto when unset)."""
    return os.environ.get("TASKRUN_LLAMA_KERNELS", "auto").strip().lower() or "auto"


def select() -> str:
    """Point LLAMA_CPP_LIB_PATH at the level ``choose`` picks, before llama_cpp is imported; the
    note says which library and why."""
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        return f"LLAMA_CPP_LIB_PATH={os.environ['LLAMA_CPP_LIB_PATH']}"
    if "llama_cpp" in sys.modules:
        return "the library already imported"
    folder, note = choose(cpu_flags(), root(), installed_lib(), wanted())
    if folder is not None:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(folder)
    return note


def build(out: Path, source: Path | None = None, jobs: int = 0) -> None:
    """Build every level's libggml-cpu from the llama.cpp source of the installed llama-cpp-python's
    sdist (``source``, else pip downloads it), into ``out/<level>`` beside copies of the installed
    libraries and a manifest holding the installed libllama's digest."""
    import llama_cpp  # the installed package must load before anything is built beside it

    lib = installed_lib()
    version = llama_cpp.__version__
    with tempfile.TemporaryDirectory(prefix="taskrun-llama-") as tmp:
        work = Path(tmp)
        if source is None:
            pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            subprocess.run([*pip, f"llama-cpp-python=={version}", "-d", str(work)], check=True)
            source = next(work.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(source) as tar:
            tar.extractall(work, filter="data")
        src = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        for name, _, options in LEVELS:
            b = work / f"build-{name}"
            subprocess.run(["cmake", "-S", str(src), "-B", str(b), *BASE_CMAKE.split(), *options.split()], check=True)
            n = str(jobs or os.cpu_count() or 1)
            subprocess.run(["cmake", "--build", str(b), "--target", "ggml-cpu", "-j", n], check=True)
            dest = out / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for f in COPIED:
                shutil.copy2(lib / f, dest / f)
            shutil.copy2((b / "bin" / "libggml-cpu.so.0").resolve(), dest / "libggml-cpu.so.0")
            (dest / "libllama.so").symlink_to("libllama.so.0")
            manifest = {"level": name, "llama_cpp_python": version, "libllama": digest(lib / "libllama.so")}
            (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            print(f"built llama.cpp {name} kernels into {dest}")


if __name__ == "__main__":  # python -m taskrun.pipelines.llm.llamacpp_kernels OUT [SDIST]
    build(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
