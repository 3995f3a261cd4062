"""generate on SmolLM2-135M-Instruct (the packaged Q4_1 GGUF): taskrun's default runtime against
plain transformers `generate` and llama.cpp direct, same prompt (~120 tokens), same threads.

Paths (each measured in its own child process, so peak RSS is each one's own; rounds interleave
the paths, so a noisy neighbour hits them alike):
  taskrun_default       what `run generate` uses: the llama.cpp engine when llama-cpp-python is installed
  taskrun_transformers  `--runtime transformers`: the lean torch decoder on float16 weights (the former default)
  plain_fp32_generate   transformers `model.generate`, float32, the GGUF converted once
  llamacpp_generate     llama-cpp-python direct, `Llama.generate` (token loop, greedy, no text handling),
                        every core for prompt and decode
  llamacpp_completion   llama-cpp-python direct, `Llama.create_completion(stream=True)` (what users call)
  llamacpp_generate_1t  as llamacpp_generate on one thread for both (llama-cpp-python's own default
                        on 2 cores, cpu_count // 2; ggml's spinning barrier makes two threads slow
                        beside busy neighbours; taskrun picks the count per prompt and while decoding)
The ratios ×lc compare with the best llama.cpp direct variant of each measure (decode, TTFT).
Each child loads its model, runs one warm-up answer on another prompt, then ``--reps`` answers on a
fresh KV state (llama-cpp-python's prompt cache is reset, so no prompt is ever reused).

Reported per path: load_s, TTFT (call → first new token), prefill tok/s (prompt tokens ÷ TTFT),
decode tok/s (tokens after the first ÷ their time), peak RSS. Also: the cold first run of
`run generate "Hi" --max-tokens 8` on a fresh cache (wall and peak RSS by /usr/bin/time, against
a bare `import torch`), and the quality guard: teacher-forced top-1 agreement of the default
path's next token with the float32 transformers model of the same weights on a 120-token text.

    python benchmarks/bench_generate.py [--quick] [--rounds N] [--reps N] [--tokens N]

Writes benchmarks/results/generate.json. llama-cpp-python built as `make install` builds it
(GGML_NATIVE=OFF, AVX/AVX2/FMA/F16C, no OpenMP). The machine may be shared: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = (
    "Write a long, detailed story about a young astronomer named Mira who builds her own "
    "telescope from a cardboard tube, two old lenses and a broom handle. Describe how she grinds "
    "the lenses, how she aligns them, the first night she points it at the Moon, what the craters "
    "look like, how she finds Jupiter and its four bright moons, and how she keeps a notebook of "
    "everything she sees. End with Mira showing the telescope to her grandmother."
)
# the warm-up answer: another long prompt, so one-time work (the llama.cpp engine's float16
# prompt copy, made once per file into the cache) is done before the timed answers; cold_start times it
WARMUP = (
    "Describe, step by step and in plain words, how a bicycle gear system works: the chainring, "
    "the cassette, the derailleurs, how the chain moves between sprockets, why low gears help on "
    "hills, how to shift smoothly under load, and what to check when the chain skips or rubs. "
    "Finish with three tips for keeping the drivetrain clean through a wet winter of commuting."
)
PATHS = (
    "taskrun_default",
    "taskrun_transformers",
    "plain_fp32_generate",
    "llamacpp_generate",
    "llamacpp_completion",
    "llamacpp_generate_1t",
)
DIRECT = ("llamacpp_generate", "llamacpp_completion", "llamacpp_generate_1t")


def threads() -> tuple[int, int]:
    """(decode, prompt) threads of the llama.cpp direct paths: every core for both, the best fixed
    choice on a quiet machine (taskrun's llama.cpp engine takes the cores free at the time; its
    torch paths decode on one thread, pipelines/device.py). TASKRUN_DECODE_THREADS fixes decode."""
    from taskrun.pipelines.device import cpu_threads

    return int(os.environ.get("TASKRUN_DECODE_THREADS", "0") or 0) or cpu_threads(), cpu_threads()


# --------------------------------------------------------------------------- one path, in a child


def _taskrun(runtime: str | None):
    from taskrun.models.resolve import resolve
    from taskrun.pipelines import RUNTIMES, load_symbol
    from taskrun.pipelines.llm.decode import Decoded
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.tasks.clock import Clock

    os.environ["TASKRUN_PROMPT_CACHE"] = "0"  # a fresh KV state every answer, as for llama.cpp direct
    card = resolve("smollm2-135m")
    rt = runtime or card.runtime
    llm = load_symbol(RUNTIMES[("generate", rt)].engine).load(card, "cpu", "auto")

    def run(prompt: str, n: int) -> dict:
        ids = llm.prompt_ids(prompt)
        out, clock = Decoded(), Clock()  # started at the call
        for _ in llm.stream(ids, Sampling(max_tokens=n), clock, out):
            pass
        return {
            "ttft_s": out.first_token_at,
            "decode_tokens_per_s": out.decode_tokens_per_s,
            "tokens": len(out.token_ids),
            "input_tokens": len(ids),
            "token_ids": out.token_ids,
        }

    return run, {"runtime": rt, "dtype": llm.dtype}


def _plain():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.gguf_convert import ensure_converted

    folder = ensure_converted(resolve("smollm2-135m"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)

    class Stamps:  # a streamer that timestamps each new token (put: the prompt first, then one per token)
        def __init__(self):
            self.times, self.calls = [], 0

        def put(self, value):
            self.calls += 1
            if self.calls > 1:
                self.times.append(time.perf_counter())

        def end(self):
            pass

    def run(prompt: str, n: int) -> dict:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        s, t0 = Stamps(), time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=n, do_sample=False, streamer=s)
        k = out.shape[1] - enc["input_ids"].shape[1]
        ts = s.times
        return {
            "ttft_s": ts[0] - t0,
            "decode_tokens_per_s": (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 1 else 0,
            "tokens": k,
            "input_tokens": int(enc["input_ids"].shape[1]),
            "token_ids": out[0, -k:].tolist(),
        }

    return run, {"runtime": "transformers generate", "dtype": "float32"}


def _direct(completion: bool, fixed_threads: int = 0):
    from taskrun.models.gguf import gguf_file
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.llamacpp_native import library

    Llama = library().Llama  # the llama.cpp library taskrun loads (same kernels): engines compared, not builds
    card = resolve("smollm2-135m")
    dec, pre = threads()
    dec, pre = fixed_threads or dec, fixed_threads or pre
    llm = Llama(str(gguf_file(card)), n_ctx=2048, n_threads=dec, n_threads_batch=pre, verbose=False)
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    # the prompt as taskrun builds it: the GGUF's template, rendered the same way, same token ids
    vocab = llm._model
    fmt = Jinja2ChatFormatter(
        llm.metadata["tokenizer.chat_template"],
        eos_token=vocab.token_get_text(vocab.token_eos()),
        bos_token=vocab.token_get_text(vocab.token_bos()),
    )

    def ids_of(prompt: str) -> list[int]:
        text = fmt(messages=[{"role": "user", "content": prompt}]).prompt
        return llm.tokenize(text.encode(), add_bos=False, special=True)

    def run(prompt: str, n: int) -> dict:
        ids, times, got = ids_of(prompt), [], []
        llm.reset()  # a fresh prompt: nothing reused from the previous call's KV cache
        t0 = time.perf_counter()
        if completion:
            for _chunk in llm.create_completion(ids, max_tokens=n, temperature=0.0, stream=True):
                times.append(time.perf_counter())
        else:
            for tok in llm.generate(ids, temp=0.0, top_k=1):
                times.append(time.perf_counter())
                got.append(tok)
                if len(got) >= n or llm.token_eos() == tok:
                    break
        return {
            "ttft_s": times[0] - t0,
            "decode_tokens_per_s": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0,
            "tokens": len(times),
            "input_tokens": len(ids),
            "token_ids": got,
        }

    return run, {"runtime": "llama-cpp-python " + ("create_completion" if completion else "generate"), "dtype": "q4_1"}


def child(path: str, n: int, reps: int) -> None:
    """Measure one path in this (fresh) process and print one JSON line."""
    from taskrun.pipelines.device import configure_threads

    configure_threads()
    t = time.perf_counter()
    run, info = {
        "taskrun_default": lambda: _taskrun(None),
        "taskrun_transformers": lambda: _taskrun("transformers"),
        "plain_fp32_generate": _plain,
        "llamacpp_generate": lambda: _direct(False),
        "llamacpp_completion": lambda: _direct(True),
        "llamacpp_generate_1t": lambda: _direct(False, 1),
    }[path]()
    load = time.perf_counter() - t
    run(WARMUP, 4)  # one-time work out of the timed answers
    rs = [run(PROMPT, n) for _ in range(reps)]
    med = {k: statistics.median(r[k] for r in rs) for k in ("ttft_s", "decode_tokens_per_s")}
    print(
        json.dumps(
            {
                "path": path,
                **info,
                "load_s": load,
                **med,
                "input_tokens": rs[0]["input_tokens"],
                "tokens": rs[0]["tokens"],
                "prefill_tokens_per_s": rs[0]["input_tokens"] / med["ttft_s"],
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "token_ids": rs[0]["token_ids"],
            }
        )
    )


def run_child(args: list[str], timeout: int = 900) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": out.stderr[-400:]}


# --------------------------------------------------------------------------- cold start, quality


def timed_cmd(cmd: list[str], env: dict) -> dict:
    """Wall seconds and peak RSS (MB) of a command, by /usr/bin/time -v."""
    t = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - t
    rss = next((int(x.split(":")[1]) / 1024 for x in out.stderr.splitlines() if "Maximum resident" in x), 0.0)
    noise = [
        x
        for x in out.stderr.splitlines()
        if x and not x.startswith(("\t", "[cut: ")) and not x.startswith("Command being timed")
    ]
    return {"wall_s": wall, "peak_rss_mb": rss, "rc": out.returncode, "stderr_lines": noise[:5]}


def cold_start(full: bool) -> dict:
    """First-ever `run generate ... -q` on a fresh cache against a bare `python -c "import torch"`
    (the floor every torch-based run pays): "Hi" with 8 tokens on the default runtime (and on
    transformers unless --quick), and the long prompt. The first run of each makes the prompt copy."""
    run = str(Path(sys.executable).with_name("run"))
    res = {"import_torch": timed_cmd([sys.executable, "-c", "import torch"], dict(os.environ))}
    cases = {"default Hi": ["Hi"], "default long prompt": [PROMPT]}
    if full:
        cases["transformers Hi"] = ["Hi", "--runtime", "transformers"]
    for label, args in cases.items():
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TASKRUN_CACHE_DIR=cache, TASKRUN_LOG_DB=os.path.join(cache, "runs.db"))
            res[label] = timed_cmd([run, "generate", *args, "--max-tokens", "8", "-q"], env)
    base = res["import_torch"]["wall_s"]
    for v in res.values():
        v["beyond_torch_import_s"] = v["wall_s"] - base
    return res


def quality(n: int = 120) -> dict:
    """Teacher-forced top-1 agreement with the float32 transformers model of the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from taskrun.models.resolve import resolve
    from taskrun.pipelines import RUNTIMES, load_symbol
    from taskrun.pipelines.llm.gguf_convert import ensure_converted

    card = resolve("smollm2-135m")
    llm = load_symbol(RUNTIMES[("generate", card.runtime)].engine).load(card, "cpu", "auto")
    ids = llm.encode((ROOT / "samples/docs/solar-system.md").read_text())[:n]
    ref_model = AutoModelForCausalLM.from_pretrained(ensure_converted(card), dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = ref_model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
    got = [int(llm.prefill(ids[:1], room=len(ids)).argmax())]
    got += [int(llm.decode_step(t).argmax()) for t in ids[1:]]
    llm.free()
    agree = sum(a == b for a, b in zip(got, ref)) / len(ref)
    return {"runtime": card.runtime, "dtype": llm.dtype, "positions": len(ref), "top1_agreement": agree}


# --------------------------------------------------------------------------- the report


def summarise(rows: dict[str, list[dict]]) -> dict:
    table = {}
    for path, rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            table[path] = {"error": rs[0].get("error", "")}
            continue
        row = {
            k: statistics.median(r[k] for r in ok)
            for k in ("ttft_s", "decode_tokens_per_s", "prefill_tokens_per_s", "peak_rss_mb", "load_s")
        }
        row.update({k: ok[0][k] for k in ("runtime", "dtype", "input_tokens", "tokens")}, samples=len(ok))
        table[path] = row
    direct = [table[p] for p in DIRECT if "ttft_s" in table.get(p, {})]
    if direct:
        best_decode = max(r["decode_tokens_per_s"] for r in direct)
        best_ttft = min(r["ttft_s"] for r in direct)
        for row in table.values():
            if "ttft_s" in row:
                row["decode_vs_llamacpp"] = row["decode_tokens_per_s"] / best_decode
                row["ttft_vs_llamacpp"] = row["ttft_s"] / best_ttft
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick", action="store_true", help="2 rounds, 2 answers each, 32 tokens, no transformers cold run"
    )
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.tokens or (32 if args.quick else 64)
    reps = args.reps or (2 if args.quick else 3)
    if args.child:
        child(args.child, n, reps)
        return
    from taskrun.runner.bench.host import host

    facts = host(bandwidth=True)  # before the contenders warm the machine
    rounds = args.rounds or (2 if args.quick else 3)
    rows: dict[str, list[dict]] = {p: [] for p in PATHS}
    for _ in range(rounds):  # interleaved: every path once per round
        for p in PATHS:
            rows[p].append(run_child(["--child", p, "--tokens", str(n), "--reps", str(reps)]))
    table = summarise(rows)
    cold = cold_start(not args.quick)
    guard = run_child_quality()
    report(table, cold, guard, n, rounds, reps)
    same = {p: rows[p][0].get("token_ids") == rows["taskrun_default"][0].get("token_ids") for p in PATHS}
    result = {
        "model": "smollm2-135m",
        "new_tokens": n,
        "rounds": rounds,
        "reps": reps,
        "threads": threads(),
        "paths": table,
        "greedy_tokens_equal_to_default": same,
        "cold_start": cold,
        "quality": guard,
        "loadavg_1min": os.getloadavg()[0],
        "quick": args.quick,
        "host": facts,
    }
    out = ROOT / "benchmarks" / "results" / "generate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out.relative_to(ROOT)}")


def run_child_quality() -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, json; sys.path.insert(0, {str(ROOT)!r}); "
            f"from benchmarks.bench_generate import quality; print(json.dumps(quality()))",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=str(ROOT),
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": out.stderr[-400:]}


def report(table: dict, cold: dict, guard: dict, n: int, rounds: int, reps: int) -> None:
    dec, pre = threads()
    print(
        f"SmolLM2-135M-Instruct Q4_1, {n} new tokens, {rounds} interleaved rounds x {reps} answers "
        f"(medians), threads: decode {dec}, prompt {pre}"
    )
    print(
        f"{'path':<22}{'runtime':<34}{'dtype':>8}{'load_s':>8}{'ttft_s':>8}{'prefill/s':>10}"
        f"{'decode/s':>9}{'RSS MB':>8}{'dec×lc':>7}{'ttft×lc':>8}"
    )
    for p, r in table.items():
        if "error" in r:
            print(f"{p:<22} failed: {r['error'][-200:]}")
            continue
        print(
            f"{p:<22}{r['runtime']:<34}{r['dtype']:>8}{r['load_s']:>8.2f}{r['ttft_s']:>8.3f}"
            f"{r['prefill_tokens_per_s']:>10.0f}{r['decode_tokens_per_s']:>9.1f}{r['peak_rss_mb']:>8.0f}"
            f"{r.get('decode_vs_llamacpp', float('nan')):>7.2f}{r.get('ttft_vs_llamacpp', float('nan')):>8.2f}"
        )
    for k, v in cold.items():
        print(
            f'cold `run generate "Hi" --max-tokens 8` [{k}]: {v["wall_s"]:.2f} s wall '
            f"({v['beyond_torch_import_s']:+.2f} s beyond `import torch`), peak RSS {v['peak_rss_mb']:.0f} MB, "
            f"stderr lines {len(v['stderr_lines'])}"
        )
    if "top1_agreement" in guard:
        print(
            f"quality: {guard['runtime']} {guard['dtype']} vs float32 transformers, teacher-forced top-1 "
            f"agreement on {guard['positions']} tokens: {guard['top1_agreement']:.1%}"
        )
    print(f"load average: {os.getloadavg()[0]:.1f} (shared machine: compare the ratios)")


if __name__ == "__main__":
    main()
