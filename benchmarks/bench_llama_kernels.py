"""Which llama.cpp CPU kernels pay on this CPU: the installed build (`make install`: portable AVX2)
against ggml's own per-ISA CPU backends, loaded at run time (GGML_BACKEND_DL), same GGUF, same
threads, same tokens. The question of issue 32 item 4: is a multi-ISA build worth its build time?

The variants are built outside the repository, from the llama.cpp source vendored in the
llama-cpp-python sdist that `make install` builds (the same commit, so its ctypes bindings match):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lc && cd /tmp/lc
    tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build-dl -DCMAKE_BUILD_TYPE=Release \\
        -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF \\
        -DGGML_OPENMP=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    make -C build-dl -j2 llama ggml-cpu-haswell ggml-cpu-sapphirerapids   # or every ggml-cpu-* variant

    python benchmarks/bench_llama_kernels.py --build /tmp/lc/build-dl/bin [--rounds N]

Or against the level `make install` builds beside the installed library (pipelines/llm/llamacpp_kernels.py):

    python benchmarks/bench_llama_kernels.py --lib avx512=.venv/lib/taskrun-llama/avx512 \
        --out benchmarks/results/llama_kernels-avx512.json

Each contender runs in its own process, rounds interleaved: `installed` is llama-cpp-python's own
library; each variant is the DL build's libllama (LLAMA_CPP_LIB_PATH) with only that variant's
libggml-cpu-*.so where ggml looks for backends (the working directory), so ggml's run-time scoring
cannot pick another. Reported: the kernel level each ran (llama_print_system_info), prefill tok/s
over --prompt-tokens, greedy decode tok/s over --tokens, and whether the greedy tokens equal the
installed build's (quality: a kernel level may round differently; it must not change the answer
unnoticed). Writes benchmarks/results/llama_kernels.json. A shared machine: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = r"""
import json, sys, time
import numpy as np
import llama_cpp
path, n_prompt, n_new, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
text = open(sys.argv[5], encoding="utf-8").read()
llm = llama_cpp.Llama(path, n_ctx=n_prompt + n_new + 16, n_batch=512, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
info = llama_cpp.llama_print_system_info().decode()
toks = llm.tokenize(text.encode(), add_bos=True)[:n_prompt]
llm.eval(toks[:32]); llm.reset()  # warm: page the weights in, first-call allocations
t = time.perf_counter(); llm.eval(toks); prefill = time.perf_counter() - t
out = []
t = time.perf_counter()
for _ in range(n_new):
    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    out.append(nxt)
    llm.eval([nxt])
decode = time.perf_counter() - t
print(json.dumps({"system_info": info, "prefill_tok_s": len(toks) / prefill, "decode_tok_s": n_new / decode,
                  "tokens": out}))
"""


def gguf(model: str) -> str:
    if model.endswith(".gguf"):
        return model
    from taskrun.models.gguf import gguf_file
    from taskrun.models.resolve import resolve

    path = gguf_file(resolve(model))
    if path is None:
        sys.exit(f"{model} has no GGUF file")
    return str(path)


def contenders(
    build: Path | None, variants: list[str] | None, libs: list[str] | None = None
) -> dict[str, tuple[dict, Path | None]]:
    out: dict[str, tuple[dict, Path | None]] = {"installed": ({"TASKRUN_LLAMA_KERNELS": "portable"}, None)}
    for spec in libs or []:  # NAME=DIR: a folder LLAMA_CPP_LIB_PATH can load (e.g. taskrun's own kernel levels)
        name, _, folder = spec.partition("=")
        if not (Path(folder) / "libllama.so").exists():
            sys.exit(f"--lib {spec}: {folder} has no libllama.so")
        out[name] = ({"LLAMA_CPP_LIB_PATH": folder}, None)
    if build is None:
        return out
    found = sorted(p.name[len("libggml-cpu-") : -3] for p in build.glob("libggml-cpu-*.so"))
    for v in variants or found:
        if v not in found:
            sys.exit(f"{build} has no libggml-cpu-{v}.so (built: {', '.join(found) or 'none'})")
        d = Path(tempfile.mkdtemp(prefix=f"kernels-{v}-"))
        (d / f"libggml-cpu-{v}.so").symlink_to(build / f"libggml-cpu-{v}.so")
        out[v] = ({"LLAMA_CPP_LIB_PATH": str(build)}, d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, help="the DL build's bin/ folder (see the docstring)")
    ap.add_argument("--variants", help="comma-separated variants (default: every one built)")
    ap.add_argument("--lib", action="append", default=[], metavar="NAME=DIR", help="a library folder to compare")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "llama_kernels.json")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    model = gguf(args.model)
    text = HERE.parent / "README.md"
    runs = contenders(args.build, args.variants.split(",") if args.variants else None, args.lib)
    got: dict[str, list[dict]] = {name: [] for name in runs}
    failed: dict[str, str] = {}
    for r in range(args.rounds):
        for name, (env, cwd) in runs.items():
            if name in failed:
                continue
            argv = [model, str(args.prompt_tokens), str(args.tokens), str(args.threads), str(text)]
            p = subprocess.run(
                [sys.executable, "-c", CHILD, *argv],
                env=os.environ | env,
                cwd=cwd,
                capture_output=True,
                text=True,
            )
            if p.returncode:  # e.g. SIGILL: the CPU says it has AMX, the VM did not enable it
                why = f"exit {p.returncode}" + (" (SIGILL: illegal instruction)" if p.returncode == -4 else "")
                failed[name] = f"{why} {p.stderr.strip()[-300:]}".strip()
                print(f"round {r + 1} {name}: failed, {why}", file=sys.stderr)
                continue
            got[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: {got[name][-1]['prefill_tok_s']:.1f} prefill tok/s", file=sys.stderr)
    ref = got["installed"]
    if not ref:
        sys.exit(f"the installed build failed: {failed['installed']}")
    rows = []
    for name, results in got.items():
        if not results:
            rows.append({"name": name, "failed": failed[name]})
            continue
        pre = statistics.median(x["prefill_tok_s"] for x in results)
        dec = statistics.median(x["decode_tok_s"] for x in results)
        rows.append(
            {
                "name": name,
                "system_info": results[0]["system_info"],
                "prefill_tok_s": round(pre, 2),
                "decode_tok_s": round(dec, 2),
                "prefill_vs_installed": round(pre / statistics.median(x["prefill_tok_s"] for x in ref), 3),
                "decode_vs_installed": round(dec / statistics.median(x["decode_tok_s"] for x in ref), 3),
                "greedy_tokens_equal_installed": results[0]["tokens"] == ref[0]["tokens"],
            }
        )
    sys.path.insert(0, str(HERE.parent.parent))
    from taskrun.runner.bench.host import host

    result = {"model": model, "threads": args.threads, "rounds": args.rounds, "rows": rows, "host": host()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        if "failed" in row:
            print(f"{row['name']:16} failed: {row['failed'][:120]}")
            continue
        print(
            f"{row['name']:16} prefill {row['prefill_tok_s']:7.1f} tok/s ({row['prefill_vs_installed']:.2f}x)  "
            f"decode {row['decode_tok_s']:6.2f} tok/s ({row['decode_vs_installed']:.2f}x)  "
            f"same greedy tokens: {row['greedy_tokens_equal_installed']}"
        )


if __name__ == "__main__":
    main()
