"""transcribe: taskrun's two runtimes against faster-whisper and the transformers ASR pipeline
called directly, on the same audio and weights in the same process, runs interleaved.

    python benchmarks/bench_transcribe.py [--quick] [--memory]

Speed: whisper-tiny.en on samples/meeting.wav (61 s, real speech with pauses). Each runtime at
its default decoding, as a user gets it: ctranslate2 and faster-whisper with beam 5 and VAD (its
own vad_filter); transformers and its ASR pipeline greedy. A greedy faster-whisper row compares
the runtimes at the same decoding. rtf = seconds of processing ÷ seconds of
audio (lower is faster), load excluded, median over rounds. --memory also measures peak RSS of a
1-minute and a 1-hour file, each in a fresh process through the CLI.
Writes benchmarks/results/transcribe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tools.wer import wer  # noqa: E402  (after the path is set)

AUDIO = ROOT / "samples" / "meeting.wav"
REFERENCE = (ROOT / "samples" / "meeting.txt").read_text()


# --------------------------------------------------------------------------- the four paths


def taskrun_path(runtime: str | None, beam: int | None = None):
    from taskrun.runner.jobs import run_job
    from taskrun.tasks.inputs import file_input
    from taskrun.tasks.transcribe import TASK, Options

    def run() -> tuple[float, str]:
        t = time.perf_counter()
        rec = run_job(TASK, lambda: [file_input(AUDIO)], Options(beam_size=beam), model="whisper-tiny.en",
                      runtime=runtime)
        elapsed = time.perf_counter() - t - rec.load_s  # load is ~0 once cached; excluded as for the others
        return elapsed, rec.results[0].text

    return run


def faster_whisper_path(beam: int, vad: bool = True):
    import soundfile as sf
    from faster_whisper import WhisperModel

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.device import cpu_threads

    model = WhisperModel(resolve("whisper-tiny.en").path, device="cpu", compute_type="float32",
                         cpu_threads=cpu_threads())

    def run() -> tuple[float, str]:
        t = time.perf_counter()
        audio, _ = sf.read(AUDIO, dtype="float32")  # already 16 kHz mono
        segments, _ = model.transcribe(audio, beam_size=beam, vad_filter=vad, language="en")
        text = " ".join(s.text.strip() for s in segments)
        return time.perf_counter() - t, text

    return run


def hf_pipeline_path():
    import soundfile as sf
    import torch
    from transformers import pipeline

    from taskrun.pipelines.device import configure_threads
    from taskrun.pipelines.speech.ct2_convert import converted_folder
    from taskrun.models.resolve import cache_dir, resolve

    configure_threads()
    folder = converted_folder(resolve("whisper-tiny.en"), cache_dir())  # the same weights
    asr = pipeline("automatic-speech-recognition", model=str(folder), device="cpu", dtype=torch.float32)

    def run() -> tuple[float, str]:
        t = time.perf_counter()
        audio, sr = sf.read(AUDIO, dtype="float32")
        with torch.inference_mode():
            out = asr({"raw": audio, "sampling_rate": sr}, chunk_length_s=30, return_timestamps=True,
                      generate_kwargs={"num_beams": 1})
        return time.perf_counter() - t, out["text"]

    return run


# --------------------------------------------------------------------------- memory


def make_long(path: Path, minutes: int, sr: int = 44100) -> None:
    """``minutes`` of 44.1 kHz stereo FLAC: the meeting recording every 5 minutes, silence between.
    Written in blocks, so making it does not need the hour in memory either."""
    import numpy as np
    import soundfile as sf
    import soxr

    speech, _ = sf.read(AUDIO, dtype="float32")
    speech = soxr.resample(speech, 16000, sr)
    with sf.SoundFile(path, "w", sr, 2, format="FLAC") as f:
        for m in range(minutes):
            block = np.zeros(60 * sr, np.float32)
            if m % 5 == 0:
                n = min(len(speech), len(block))
                block[:n] = speech[:n]
            f.write(np.stack([block, block], axis=1))


def peak_rss(path: Path) -> dict:
    env = {**os.environ, "TASKRUN_LOG_DB": str(path.with_suffix(".db"))}
    out = subprocess.run([str(Path(sys.executable).parent / "run"), "transcribe", str(path), "--json", "-q"],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    j = json.loads(out.stdout.strip().splitlines()[-1])
    m = j["metrics"]
    return {"audio_s": m["audio_s"], "peak_rss_mb": m["peak_rss_mb"], "chunks": m["chunks"],
            "rtf": round(m["rtf"], 4), "wall_s": m["wall_s"]}


def memory() -> dict:
    with tempfile.TemporaryDirectory() as d:
        rows = {}
        for minutes in (1, 60):
            p = Path(d) / f"long-{minutes}min.flac"
            make_long(p, minutes)
            rows[f"{minutes}min"] = peak_rss(p)
            print(f"  {minutes:>2} min: {rows[f'{minutes}min']}", flush=True)
    rows["ratio_1h_over_1min"] = round(rows["60min"]["peak_rss_mb"] / rows["1min"]["peak_rss_mb"], 3)
    return rows


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 rounds instead of 4")
    ap.add_argument("--memory", action="store_true", help="also peak RSS for a 1-minute and a 1-hour file")
    ap.add_argument("--memory-only", action="store_true", help="only the memory measurement")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "results" / "transcribe.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    mem = None
    if args.memory or args.memory_only:
        # First, while this process is small: a child's peak RSS (getrusage) starts from its
        # parent's size at fork, so measuring after the models load here would report those.
        print("peak RSS through the CLI, fresh process each (44.1 kHz stereo FLAC, speech every 5 min):")
        mem = memory()
        print(f"  1 h ÷ 1 min: {mem['ratio_1h_over_1min']}")
        if args.memory_only:
            old = json.loads(out.read_text()) if out.exists() else {}
            out.write_text(json.dumps({**old, "memory": mem}, indent=1) + "\n")
            return
    import soundfile as sf

    audio_s = sf.info(AUDIO).duration
    paths = {"taskrun (ctranslate2)": taskrun_path(None), "faster-whisper direct": faster_whisper_path(5),
             "taskrun (transformers)": taskrun_path("transformers"),
             "transformers pipeline direct": hf_pipeline_path(),
             "faster-whisper direct, greedy": faster_whisper_path(1)}
    times: dict[str, list[float]] = {k: [] for k in paths}
    texts = {}
    for name, run in paths.items():  # warm-up: loads, conversion, first-call allocations
        texts[name] = run()[1]
    for r in range(2 if args.quick else 4):
        for name, run in (paths.items() if r % 2 == 0 else reversed(list(paths.items()))):
            t, texts[name] = run()
            times[name].append(t)
    rows = {}
    for name in paths:
        med = statistics.median(times[name])
        rows[name] = {"rtf": round(med / audio_s, 4), "seconds": round(med, 3),
                      "runs_s": [round(t, 3) for t in times[name]], "wer": round(wer(REFERENCE, texts[name]), 4)}
    fw = rows["faster-whisper direct"]["seconds"]
    ratios = {
        "taskrun_ct2_speed_vs_faster_whisper": round(fw / rows["taskrun (ctranslate2)"]["seconds"], 3),
        "taskrun_transformers_time_over_faster_whisper": round(rows["taskrun (transformers)"]["seconds"] / fw, 3),
        "taskrun_transformers_time_over_faster_whisper_greedy": round(
            rows["taskrun (transformers)"]["seconds"] / rows["faster-whisper direct, greedy"]["seconds"], 3),
        "taskrun_transformers_speed_vs_hf_pipeline": round(
            rows["transformers pipeline direct"]["seconds"] / rows["taskrun (transformers)"]["seconds"], 3),
    }
    print(f"\nwhisper-tiny.en, {AUDIO.name} ({audio_s:.1f} s), each runtime's default decoding, {os.cpu_count()} CPUs "
          f"(shared with other work: absolute numbers are noisy, ratios are same-run)")
    print(f"{'path':<32} {'rtf':>7} {'median s':>9} {'WER':>6}")
    for name, row in rows.items():
        print(f"{name:<32} {row['rtf']:>7.4f} {row['seconds']:>9.3f} {row['wer']:>6.3f}")
    for k, v in ratios.items():
        print(f"{k:<54} {v}")
    result = {"audio": str(AUDIO.relative_to(ROOT)), "audio_s": round(audio_s, 3), "model": "whisper-tiny.en",
              "decoding": "ctranslate2/faster-whisper beam 5 + VAD; transformers greedy",
              "cpus": os.cpu_count(), "machine_busy": True, "paths": rows, "ratios": ratios,
              "targets": {"taskrun_rtf": 0.05, "taskrun_ct2_speed_vs_faster_whisper": 0.95,
                          "taskrun_transformers_time_over_faster_whisper": 1.5}}
    if mem is not None:
        result["memory"] = mem
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
