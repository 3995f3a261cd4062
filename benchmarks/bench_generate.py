"""generate: taskrun's default decode path against plain transformers `generate` (float32, default
settings) on SmolLM2-135M, same prompt (~120 tokens), same process, runs interleaved.

Reports TTFT (call → first new token, model already loaded) and decode tokens/s (tokens after the
first ÷ their time) for each, the ratios, and the decode ceiling of each dtype: bytes of weights
read per token ÷ the memory bandwidth measured in this run (a large tensor sum). Also: top-1
agreement of the default (float16 weights) with float32, and the thread settings beside a busy neighbour.

    python benchmarks/bench_generate.py [--quick]

Writes benchmarks/results/generate.json. The machine may be shared: compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from taskrun.pipelines.device import configure_threads  # noqa: E402

configure_threads()  # OMP_WAIT_POLICY=PASSIVE before torch loads, as the runner does

import torch  # noqa: E402

PROMPT = ("Write a long, detailed story about a young astronomer named Mira who builds her own "
          "telescope from a cardboard tube, two old lenses and a broom handle. Describe how she grinds "
          "the lenses, how she aligns them, the first night she points it at the Moon, what the craters "
          "look like, how she finds Jupiter and its four bright moons, and how she keeps a notebook of "
          "everything she sees. End with Mira showing the telescope to her grandmother.")


def bandwidth_gbs(reps: int = 5) -> float:
    """Weight-streaming bandwidth: a 512 MiB float32 sum, best of ``reps`` (GB/s)."""
    big = torch.ones(128 * 1024 * 1024)
    best = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        big.sum()
        best = max(best, big.numel() * 4 / (time.perf_counter() - t) / 1e9)
    del big
    return best


def weight_params(model) -> int:
    """Parameters read per decoded token: every linear layer and the LM head (the embedding
    table is read one row per token, so it is left out unless it is tied to the head)."""
    n = sum(m.weight.numel() for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name != "lm_head")
    return n + model.lm_head.weight.numel()


class FirstTokenTimer:
    """A transformers streamer that only timestamps each new token (put is called with the
    prompt first, then once per generated token)."""

    def __init__(self):
        self.times, self.calls = [], 0

    def put(self, value):
        self.calls += 1
        if self.calls > 1:
            self.times.append(time.perf_counter())

    def end(self):
        pass


def run_plain(model, tok, n):
    msgs = [{"role": "user", "content": PROMPT}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    timer = FirstTokenTimer()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=n, streamer=timer)
    k = out.shape[1] - enc["input_ids"].shape[1]
    ts = timer.times
    return {"ttft_s": ts[0] - t0, "decode_tokens_per_s": (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 1 else 0.0,
            "tokens": k, "input_tokens": int(enc["input_ids"].shape[1]), "token_ids": out[0, -k:].tolist()}


def run_taskrun(llm, n):
    from taskrun.pipelines.llm.decode import Decoded
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.tasks.clock import Clock

    ids = llm.prompt_ids(PROMPT)
    out = Decoded()
    clock = Clock()  # started at the call, like the plain run's t0
    for _ in llm.stream(ids, Sampling(max_tokens=n), clock, out):
        pass
    return {"ttft_s": out.first_token_at, "decode_tokens_per_s": out.decode_tokens_per_s,
            "tokens": len(out.token_ids), "input_tokens": len(ids), "token_ids": out.token_ids}


def top1_agreement(ref_model, llm, text_ids) -> float:
    """Share of positions of a text where the lean decoder's next-token argmax equals float32
    transformers' (teacher-forced, so one disagreement does not derail the rest)."""
    with torch.inference_mode():
        ref = ref_model(torch.tensor([text_ids])).logits[0].argmax(-1).tolist()
    f = llm.fast
    f.reset()
    got = [int(f.forward(torch.tensor([t])).argmax()) for t in text_ids]
    return sum(a == b for a, b in zip(got, ref)) / len(ref)


def neighbour_child(n: int) -> None:
    """One measurement in a fresh process (the wait policy is read when torch loads)."""
    from taskrun.pipelines.llm.hf_engine import TransformersLLM
    from taskrun.models.resolve import resolve

    llm = TransformersLLM.load(resolve("smollm2-135m"), "cpu", "auto")
    run_taskrun(llm, 8)  # warm-up
    r = run_taskrun(llm, n)
    print(json.dumps({"decode_tokens_per_s": r["decode_tokens_per_s"], "ttft_s": r["ttft_s"],
                      "threads": torch.get_num_threads(), "policy": os.environ.get("OMP_WAIT_POLICY")}))


def neighbour_matrix(n: int) -> list[dict]:
    """taskrun's default path without and beside a busy Python loop, under: what the runner sets
    (OMP_WAIT_POLICY unset, so configure_threads makes it PASSIVE), the OpenMP library's own
    default (set to empty, which configure_threads leaves alone), spinning threads (ACTIVE), and
    the runner's setting with one thread."""
    rows = []
    settings = [("runner (PASSIVE)", None, None), ("library default", "", None), ("ACTIVE", "ACTIVE", None),
                ("runner, 1 thread", None, "1")]
    for busy in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for label, policy, threads in settings:
                env = dict(os.environ)
                env.pop("OMP_WAIT_POLICY", None)
                env.pop("TASKRUN_THREADS", None)
                if policy is not None:
                    env["OMP_WAIT_POLICY"] = policy
                if threads:
                    env["TASKRUN_THREADS"] = threads
                out = subprocess.run([sys.executable, __file__, "--child", str(n)], env=env,
                                     capture_output=True, text=True, timeout=300)
                line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
                r = json.loads(line) if line.startswith("{") else {"error": out.stderr[-300:]}
                rows.append({"neighbour": busy, "setting": label, **r})
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repeats, no neighbour test")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        neighbour_child(args.child)
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from taskrun.pipelines.llm.gguf_convert import ensure_converted
    from taskrun.pipelines.llm.hf_engine import TransformersLLM
    from taskrun.models.resolve import resolve

    n, reps = (32, 2) if args.quick else (64, 4)
    card = resolve("smollm2-135m")
    folder = ensure_converted(card)
    t = time.perf_counter()
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    plain_tok = AutoTokenizer.from_pretrained(folder)
    plain_load = time.perf_counter() - t
    t = time.perf_counter()
    default = TransformersLLM.load(card, "cpu", "auto")  # what `run generate` uses
    default_load = time.perf_counter() - t
    exact = TransformersLLM.load(card, "cpu", "float32")  # the lean decoder, unrounded
    runs = {"plain_fp32_generate": [], "taskrun_default": [], "taskrun_float32": []}
    bws = []
    run_plain(plain, plain_tok, 4), run_taskrun(default, 4), run_taskrun(exact, 4)  # warm-up
    for _ in range(reps):  # interleaved, so a noisy neighbour hits every variant alike
        bws.append(bandwidth_gbs(2))
        runs["plain_fp32_generate"].append(run_plain(plain, plain_tok, n))
        runs["taskrun_default"].append(run_taskrun(default, n))
        runs["taskrun_float32"].append(run_taskrun(exact, n))
    bw = statistics.median(bws)  # under the same contention as the decode runs (medians too)
    params = weight_params(plain)
    from taskrun.pipelines.llm.llama_fast import BYTES

    bytes_per_token = {"float32": params * 4, **{k: params * v for k, v in BYTES.items()}}
    table = {}
    for name, rs in runs.items():
        table[name] = {"ttft_s": statistics.median(r["ttft_s"] for r in rs),
                       "decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in rs),
                       "tokens": rs[0]["tokens"], "input_tokens": rs[0]["input_tokens"]}
    table["plain_fp32_generate"]["dtype"] = "float32"
    table["taskrun_float32"]["dtype"] = "float32"
    table["taskrun_default"]["dtype"] = default.dtype
    for name, row in table.items():
        ceiling = bw * 1e9 / bytes_per_token.get(row["dtype"], params * 4)
        row["ceiling_tokens_per_s"] = ceiling
        row["share_of_ceiling"] = row["decode_tokens_per_s"] / ceiling
    base = table["plain_fp32_generate"]
    for row in table.values():
        row["decode_ratio_vs_plain"] = row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
        row["ttft_ratio_vs_plain"] = row["ttft_s"] / base["ttft_s"]
    same_tokens = runs["taskrun_float32"][0]["token_ids"] == runs["plain_fp32_generate"][0]["token_ids"][
        :len(runs["taskrun_float32"][0]["token_ids"])]
    text_ids = plain_tok.encode((ROOT / "samples/docs/solar-system.md").read_text())[:120]
    agreement = top1_agreement(plain, default, text_ids) if default.fast is not None else None

    print(f"SmolLM2-135M, prompt {base['input_tokens']} tokens, {n} new tokens, median of {reps} interleaved "
          f"runs; torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print(f"memory bandwidth (512 MiB sum, median of {len(bws)}): {bw:.1f} GB/s (best {max(bws):.1f}); "
          f"weights read per token: "
          f"{params / 1e6:.0f}M params = {bytes_per_token['float32'] / 1e6:.0f} MB float32, "
          f"{bytes_per_token['float16'] / 1e6:.0f} MB float16, {bytes_per_token['int8'] / 1e6:.0f} MB int8")
    print(f"{'path':<22}{'dtype':>8}{'ttft_s':>9}{'decode/s':>10}{'×plain':>8}{'ceiling':>9}{'of ceil':>9}")
    for name, r in table.items():
        print(f"{name:<22}{r['dtype']:>8}{r['ttft_s']:>9.3f}{r['decode_tokens_per_s']:>10.1f}"
              f"{r['decode_ratio_vs_plain']:>8.2f}{r['ceiling_tokens_per_s']:>9.1f}{r['share_of_ceiling']:>9.0%}")
    print(f"load (model already converted): plain from_pretrained {plain_load:.2f} s, taskrun default "
          f"{default_load:.2f} s (includes packing the {default.dtype} weights)")
    print(f"taskrun float32 greedy tokens identical to plain generate: {same_tokens}")
    if agreement is not None:
        print(f"{default.dtype} default vs float32, teacher-forced top-1 agreement on {len(text_ids)} "
              f"tokens: {agreement:.1%}")
    neighbour = [] if args.quick else neighbour_matrix(24)
    if neighbour:
        print("beside a busy neighbour (python busy loop), taskrun default path, 24 tokens, fresh process each:")
    for r in neighbour:
        print(f"  neighbour={'busy' if r['neighbour'] else 'none':<5} {r['setting']:<18} "
              f"threads={r.get('threads', '?')} policy={r.get('policy')!s:<8} "
              f"decode/s={r.get('decode_tokens_per_s', float('nan')):6.1f} ttft_s={r.get('ttft_s', float('nan')):.3f}")
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} (machine shared with other engineers: "
          f"absolute numbers are noisy, ratios are measured interleaved)")
    result = {"model": card.name, "digest": card.digest, "new_tokens": n, "repeats": reps,
              "bandwidth_gbs": bw, "bandwidth_samples_gbs": bws, "weight_params": params, "bytes_per_token": bytes_per_token,
              "paths": table, "float32_tokens_identical": same_tokens, "default_top1_agreement": agreement,
              "load_s": {"plain": plain_load, "taskrun_default": default_load},
              "neighbour": neighbour, "loadavg_1min": load[0], "threads": torch.get_num_threads(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "quick": args.quick}
    out = ROOT / "benchmarks" / "results" / "generate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
