"""run batch: one warm process against a shell loop of CLI calls and against one big CLI call, on
the local engine and on Ray; and its memory as the input grows.

    python benchmarks/bench_batch.py [--quick] [--n 20000] [--loop 20] [--clips 20] [--rss-lines 100000]

Every path is the real command line in a fresh process (`run ...`), timed from start to exit as a
user waits, on the same inputs, in one run (compare the ratios; absolute numbers depend on the
machine and its neighbours):

- embed N sentences (benchmarks/bench_embed.py's mixed-length sentences, default minilm):
  `run batch embed s.txt`, one `run embed -f s.txt --json`, and a shell loop of `run embed TEXT`
  (one sentence per call: its rate is extrapolated from --loop calls, as the loop over all N
  would take hours). Targets: batch within 10% of the single -f call, >= 50x the loop.
- transcribe a folder of short clips cut from samples/meeting.wav (whisper-tiny.en): `run batch`
  with its default pool (a process per core), with one process (--workers 1), and a shell loop of
  `run transcribe CLIP`; rtf = wall ÷ audio seconds, for the whole batch.
- the embedding batch on Ray Data (--engine ray) with 1 and 2 actors on a private local cluster.
- peak RSS of `run batch` at 1,000 and --rss-lines lines of embed (from its lines' peak_rss_mb).

--quick: 2,000 sentences, 3 loop calls, 6 clips, 1k vs 10k lines for memory. Writes
benchmarks/results/batch.json (batch-quick.json for --quick, so a smoke run never replaces
the full numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUN = str(Path(sys.executable).parent / "run")

from benchmarks.bench_embed import sentences  # noqa: E402 (needs the checkout on sys.path)


def timed(args: list[str], env: dict) -> float:
    """Seconds from start to exit of one command; its failure stops the benchmark."""
    t = time.perf_counter()
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return dt


def read_lines(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def vectors_of_batch(path: Path) -> dict[str, list[float]]:
    return {x["result"]["text"]: x["result"]["vector"] for x in read_lines(path)}


def max_abs_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    return max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)


def bench_embed(args, tmp: Path, env: dict) -> dict:
    texts = sentences(args.n)
    src = tmp / "sentences.txt"
    src.write_text("\n".join(texts) + "\n")
    batch_s = timed([RUN, "batch", "embed", str(src), "-o", str(tmp / "batch.jsonl"), "-q"], env)
    one_s = timed([RUN, "embed", "-f", str(src), "--json", "-q", "-o", str(tmp / "one.json")], env)
    loop_s = sum(timed([RUN, "embed", "--json", "-q", "--", texts[i]], env) for i in range(args.loop))
    one = {it["result"]["text"]: it["result"]["vector"] for it in json.loads((tmp / "one.json").read_text())["items"]}
    rates = {"batch": args.n / batch_s, "one_call_f": args.n / one_s, "loop": args.loop / loop_s}
    return {
        "sentences": args.n,
        "batch_s": round(batch_s, 2),
        "one_call_f_s": round(one_s, 2),
        "loop_calls": args.loop,
        "loop_s": round(loop_s, 2),
        "loop_extrapolated_s": round(loop_s / args.loop * args.n, 1),
        "items_per_s": {k: round(v, 2) for k, v in rates.items()},
        "batch_vs_one_call": round(rates["batch"] / rates["one_call_f"], 3),
        "batch_vs_loop": round(rates["batch"] / rates["loop"], 1),
        "max_abs_diff_batch_vs_f": max_abs_diff(vectors_of_batch(tmp / "batch.jsonl"), one),
    }


def make_clips(folder: Path, n: int, seconds: float = 3.0) -> float:
    """``n`` clips of real speech cut from samples/meeting.wav; returns their total seconds."""
    import soundfile as sf

    audio, sr = sf.read(ROOT / "samples" / "meeting.wav", dtype="int16")
    folder.mkdir(parents=True, exist_ok=True)
    step = (len(audio) / sr - seconds) / max(1, n - 1)
    for i in range(n):
        a = int(i * step * sr)
        sf.write(folder / f"clip{i:02d}.wav", audio[a : a + int(seconds * sr)], sr, subtype="PCM_16")
    return n * seconds


def bench_transcribe(args, tmp: Path, env: dict) -> dict:
    clips = tmp / "clips"
    audio_s = make_clips(clips, args.clips)
    pool_s = timed([RUN, "batch", "transcribe", str(clips), "-o", str(tmp / "t-pool.jsonl"), "-q"], env)
    one_s = timed([RUN, "batch", "transcribe", str(clips), "-o", str(tmp / "t-one.jsonl"), "-q", "--workers", "1"], env)
    files = sorted(clips.iterdir())[: args.loop_clips]
    loop_s = sum(timed([RUN, "transcribe", str(f), "--json", "-q"], env) for f in files)
    loop_audio = len(files) * audio_s / args.clips
    same = {x["id"]: x["result"]["text"] for x in read_lines(tmp / "t-pool.jsonl")} == {
        x["id"]: x["result"]["text"] for x in read_lines(tmp / "t-one.jsonl")
    }
    return {
        "clips": args.clips,
        "audio_s": audio_s,
        "batch_pool_s": round(pool_s, 2),
        "batch_one_process_s": round(one_s, 2),
        "loop_clips": len(files),
        "loop_s": round(loop_s, 2),
        "rtf": {
            "batch_pool": round(pool_s / audio_s, 3),
            "batch_one_process": round(one_s / audio_s, 3),
            "loop": round(loop_s / loop_audio, 3),
        },
        "pool_speedup": round(one_s / pool_s, 2),
        "pool_and_one_process_transcripts_identical": same,
    }


def bench_ray(args, tmp: Path, env: dict) -> dict:
    src = tmp / "sentences.txt"
    local = vectors_of_batch(tmp / "batch.jsonl")
    out = {}
    for actors in (1, 2):
        path = tmp / f"ray{actors}.jsonl"
        dt = timed(
            [RUN, "batch", "embed", str(src), "-o", str(path), "-q", "--engine", "ray", "--actors", str(actors)], env
        )
        out[f"actors_{actors}"] = {
            "s": round(dt, 2),
            "items_per_s": round(args.n / dt, 2),
            "max_abs_diff_vs_local": max_abs_diff(vectors_of_batch(path), local),
        }
    return out


def bench_rss(args, tmp: Path, env: dict) -> dict:
    """Peak RSS of the whole process (its lines' peak_rss_mb: ru_maxrss at each job's end)."""
    out = {}
    # The larger input repeats the 1,000 sentences: the same longest text, so the same largest
    # activations; only the input's length differs (fresh sentences reach longer maxima).
    base = sentences(1000, seed=1)
    for n in (1000, args.rss_lines):
        src = tmp / f"rss-{n}.txt"
        src.write_text("\n".join((base * (n // 1000 + 1))[:n]) + "\n")
        path = tmp / f"rss-{n}.jsonl"
        dt = timed([RUN, "batch", "embed", str(src), "-o", str(path), "-q"], env)
        peak = max(x["metrics"]["peak_rss_mb"] for x in read_lines(path))
        out[str(n)] = {"peak_rss_mb": peak, "s": round(dt, 1)}
        path.unlink()
    small, large = out["1000"]["peak_rss_mb"], out[str(args.rss_lines)]["peak_rss_mb"]
    out["ratio"] = round(large / small, 3)
    return out


def report(result: dict) -> None:
    e, t, r, m = result["embed"], result["transcribe"], result["ray"], result["rss"]
    print(
        f"embed {e['sentences']} sentences   items/s: batch {e['items_per_s']['batch']}, "
        f"one -f call {e['items_per_s']['one_call_f']}, loop {e['items_per_s']['loop']} "
        f"(extrapolated from {e['loop_calls']} calls)"
    )
    print(
        f"  batch / one call {e['batch_vs_one_call']}x   batch / loop {e['batch_vs_loop']}x   "
        f"max |diff| {e['max_abs_diff_batch_vs_f']:.2e}"
    )
    print(
        f"transcribe {t['clips']} clips ({t['audio_s']} s)   rtf: batch+pool {t['rtf']['batch_pool']}, "
        f"batch 1 process {t['rtf']['batch_one_process']}, loop {t['rtf']['loop']}   "
        f"pool speedup {t['pool_speedup']}x   identical {t['pool_and_one_process_transcripts_identical']}"
    )
    for k, v in r.items():
        print(
            f"ray {k}: {v['s']} s, {v['items_per_s']} items/s (local batch {e['batch_s']} s), "
            f"max |diff| vs local {v['max_abs_diff_vs_local']:.2e}"
        )
    print(
        "peak RSS: "
        + ", ".join(f"{k} lines {v['peak_rss_mb']} MB" for k, v in m.items() if k != "ratio")
        + f"   ratio {m['ratio']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--loop", type=int, default=20, help="`run embed` calls timed for the loop's rate")
    ap.add_argument("--clips", type=int, default=20)
    ap.add_argument("--loop-clips", type=int, default=20, help="`run transcribe` calls in the loop")
    ap.add_argument("--rss-lines", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.n, args.loop, args.clips, args.loop_clips, args.rss_lines = 2000, 3, 6, 3, 10_000
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as d:
        tmp = Path(d)
        env = dict(
            os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TASKRUN_LOG_DB=str(tmp / "runs.db")
        )  # the benchmark's jobs stay out of the user's log
        from taskrun.runner.bench.host import host

        result = {
            "benchmark": "batch",
            "quick": args.quick,
            "machine": f"{platform.machine()} {os.cpu_count()} cpus",
            "host": host(bandwidth=True),
            "command": "python " + " ".join(sys.argv),
        }
        for name, part in (
            ("embed", bench_embed),
            ("transcribe", bench_transcribe),
            ("ray", bench_ray),
            ("rss", bench_rss),
        ):
            t = time.perf_counter()
            result[name] = part(args, tmp, env)
            print(f"[{name} done in {time.perf_counter() - t:.0f} s]", file=sys.stderr, flush=True)
    report(result)
    out = ROOT / "benchmarks" / "results" / ("batch-quick.json" if args.quick else "batch.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
