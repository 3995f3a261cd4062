"""Which llama.cpp library a job loads (pipelines/llm/llamacpp_kernels.py): the AVX-512 build only
where the CPU has every flag it was compiled for and only beside the libllama it was built with;
otherwise the portable one, and the run log says which and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taskrun.pipelines.llm import llamacpp_kernels as k
from taskrun.tasks.base import TaskError

ZEN3 = set("pni ssse3 avx fma f16c avx2 bmi2".split())
ZEN4 = ZEN3 | set(k.LEVELS[0][1].split())
SPR = ZEN4 | {"amx_int8", "amx_tile", "amx_bf16"}


@pytest.fixture
def built(tmp_path):
    """A folder laid out as `make install` leaves it, beside a stand-in installed library."""
    lib = tmp_path / "site" / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (lib / "libllama.so").write_bytes(b"the installed libllama")
    level = tmp_path / "levels" / "avx512"
    level.mkdir(parents=True)
    (level / k.MANIFEST).write_text(json.dumps({"level": "avx512", "libllama": k.digest(lib / "libllama.so")}))
    return tmp_path / "levels", lib


def test_the_avx512_build_is_chosen_only_where_the_cpu_has_every_flag_it_needs(built):
    where, lib = built
    for flags in (ZEN4, SPR):  # Sapphire Rapids too: the level has no AMX, which SIGILLs in its VMs
        folder, note = k.choose(flags, where, lib)
        assert folder == where / "avx512" and note == "taskrun's avx512 build, chosen from /proc/cpuinfo"
    folder, note = k.choose(ZEN3, where, lib)
    assert folder is None and "this CPU lacks avx512_bf16, avx512_vnni" in note
    folder, note = k.choose(ZEN4 - {"avx512_bf16"}, where, lib)
    assert folder is None and note == "portable build (avx512: this CPU lacks avx512_bf16)"


def test_a_build_made_for_another_llama_cpp_python_is_not_loaded(built):
    where, lib = built
    (lib / "libllama.so").write_bytes(b"a reinstalled libllama")  # pip reinstalled another version
    folder, note = k.choose(ZEN4, where, lib)
    assert folder is None and "built for another llama-cpp-python (make install rebuilds it)" in note
    (where / "avx512" / k.MANIFEST).write_text("{ half written")
    assert k.choose(ZEN4, where, lib)[0] is None
    folder, note = k.choose(ZEN4, where / "nowhere", lib)
    assert folder is None and "not built (make install builds it into" in note


def test_the_user_can_ask_for_a_level_and_hears_why_not(built):
    where, lib = built
    assert k.choose(SPR, where, lib, "portable") == (None, "portable build (TASKRUN_LLAMA_KERNELS=portable)")
    assert k.choose(SPR, where, lib, "avx512")[0] == where / "avx512"
    with pytest.raises(TaskError, match="TASKRUN_LLAMA_KERNELS=avx512: avx512: this CPU lacks"):
        k.choose(ZEN3, where, lib, "avx512")
    with pytest.raises(TaskError, match="use auto, portable or one of avx512"):
        k.choose(SPR, where, lib, "amx")


def test_a_library_path_the_user_set_is_left_alone(monkeypatch):
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "/opt/my-llama")
    assert k.select() == "LLAMA_CPP_LIB_PATH=/opt/my-llama"
    assert os.environ["LLAMA_CPP_LIB_PATH"] == "/opt/my-llama"


CHILD = r"""
import json, sys
import numpy as np
from taskrun.pipelines.llm.llamacpp_native import kernel_note, library
llama_cpp = library()
llm = llama_cpp.Llama(sys.argv[1], n_ctx=256, n_threads=2, n_threads_batch=2, verbose=False)
llm.eval(llm.tokenize(b"def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", add_bos=True))
out = []
for _ in range(24):
    out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    llm.eval([out[-1]])
print(json.dumps({"note": kernel_note(), "tokens": out}))
"""


@pytest.mark.real
def test_the_avx512_build_loads_and_gives_the_portable_builds_greedy_tokens():
    """On a host with AVX-512 and the build `make install` made: jobs load it, and a real model's
    greedy answer is token for token the portable library's (other kernels round differently; they
    must not change the answer unnoticed). Elsewhere: the portable library, and the note says why."""
    from taskrun.models.gguf import gguf_file
    from taskrun.models.resolve import resolve

    model = str(gguf_file(resolve("qwen2.5-coder-0.5b")))
    env = {x: v for x, v in os.environ.items() if x != "LLAMA_CPP_LIB_PATH"}
    runs = {}
    for want in ("auto", "portable"):
        p = subprocess.run(
            [sys.executable, "-c", CHILD, model],
            env=env | {"TASKRUN_LLAMA_KERNELS": want},
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        runs[want] = json.loads(p.stdout.strip().splitlines()[-1])
    assert runs["portable"]["note"].startswith("llama.cpp CPU kernels: AVX2")
    folder, why = k.choose(k.cpu_flags(), k.root(), k.installed_lib())
    if folder is None:
        assert why in runs["auto"]["note"]
        pytest.skip(f"the AVX-512 build is not used here: {why}")
    assert runs["auto"]["note"].startswith("llama.cpp CPU kernels: AVX512_BF16; taskrun's avx512 build"), runs
    assert runs["auto"]["tokens"] == runs["portable"]["tokens"]
    assert Path(folder, "libggml-cpu.so.0").stat().st_size > 0


def test_the_test_process_runs_the_library_a_job_would_choose():
    """tests/conftest.py imports llama.cpp as a job does, before any test module's
    ``importorskip("llama_cpp")``: the tests' in-process jobs and the servers and CLIs they start
    run the same kernels (on SmolLM2 the two levels word 8 of 24 greedy answers differently)."""
    pytest.importorskip("llama_cpp")
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        pytest.skip("the LLAMA_CPP_LIB_PATH this test run was given chooses the library")
    import llama_cpp.llama_cpp as bindings

    from taskrun.pipelines.llm.llamacpp_native import _STATE, library

    library()
    folder, why = k.choose(k.cpu_flags(), k.root(), k.installed_lib(), k.wanted())
    loaded = Path(bindings._lib._name).resolve()
    assert loaded.parent == (folder or k.installed_lib()).resolve(), (loaded, why)
    assert _STATE["build"] == why
    assert "LLAMA_CPP_LIB_PATH" not in os.environ  # taken back: each child process chooses for itself
