"""transcribe --speakers: what saying who spoke adds to a transcription, on samples/meeting.wav
(61 s, three readers), whisper-tiny.en, ctranslate2, default decoding. Plain and --speakers jobs
run interleaved in one process after a warm-up of each (both models loaded, load excluded);
rtf is the whole job (read, VAD, decode, and with --speakers embedding and clustering).
Target (issue 29): --speakers adds at most 25 % (ratio <= 1.25).

    python benchmarks/bench_speakers.py [--rounds N] [--memory] [--clustering]

--clustering: linkage vs spectral (eigengap count) on meeting.wav's windows cut at its reference
turns (samples/meeting.tsv), the real GE2E embeddings: speakers found and share of windows right.

--memory: peak RSS of --speakers on a 1-hour and a 1-minute file (bench_transcribe.py's FLACs,
speech every 5 min), each in a fresh process through the CLI; target: within 10 %.

Writes benchmarks/results/transcribe-speakers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
AUDIO = ROOT / "samples" / "meeting.wav"


def job(speakers: bool):
    from taskrun.runner.jobs import run_job
    from taskrun.tasks.inputs import file_input
    from taskrun.tasks.transcribe import TASK, Options

    return run_job(TASK, lambda: [file_input(AUDIO)], Options(speakers=speakers), log=None)


def memory() -> dict:
    import tempfile

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_transcribe import make_long, peak_rss

    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for minutes in (1, 60):
            p = Path(d) / f"long-{minutes}min.flac"
            make_long(p, minutes)
            rows[f"{minutes}min"] = peak_rss(p, "--speakers")
            print(f"  {minutes:>2} min: {rows[f'{minutes}min']}", flush=True)
    rows["ratio_1h_over_1min"] = round(rows["60min"]["peak_rss_mb"] / rows["1min"]["peak_rss_mb"], 3)
    return rows


def clustering() -> dict:
    import numpy as np
    import soundfile as sf

    from taskrun.models.resolve import resolve
    from taskrun.pipelines.speech.diarize import METHODS, MIN_S, SPEAKER_MODEL, split_span
    from taskrun.pipelines.speech.speakers import GE2EEngine
    from tests.test_transcribe import utterances

    x, sr = sf.read(AUDIO, dtype="float32")
    wins, ref = [], []
    for a, b, src, _ in utterances():
        for wa, wb in split_span(int(a * sr), int(b * sr), sr):
            if wb - wa >= MIN_S * sr:
                wins.append(x[wa:wb])
                ref.append(src.split("/")[0].split(".")[0])
    emb = GE2EEngine.load(resolve(SPEAKER_MODEL, offline=True)).embed(wins)
    ref_a = np.array(ref)
    rows = {"windows": len(wins), "voices": len(set(ref))}
    for name, fn in METHODS.items():
        ids = fn(emb)
        right = sum(max(int(np.sum((ids == c) & (ref_a == v))) for v in set(ref)) for c in set(ids.tolist()))
        one = fn(emb[ref_a == ref[0]])
        rows[name] = {
            "speakers": len(set(ids.tolist())),
            "windows_right": round(right / len(ids), 3),
            "one_reader_speakers": len(set(one.tolist())),
        }
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="also peak RSS, 1 hour vs 1 minute, with --speakers")
    ap.add_argument("--clustering", action="store_true", help="only compare linkage and spectral clustering")
    args = ap.parse_args()
    if args.clustering:
        print(json.dumps(clustering(), indent=1))
        return
    mem = memory() if args.memory else None  # first, while this process is small (a child starts at its size)
    job(False), job(True)  # warm-up: both models loaded and cached
    rtf: dict[bool, list[float]] = {False: [], True: []}
    diarize, found = [], set()
    for _ in range(args.rounds):
        for sp in (False, True):
            m = job(sp).metrics
            rtf[sp].append(m.rtf)
            if sp:
                diarize.append(m.diarize_s)
                found.add(m.speakers)
    plain, with_sp = statistics.median(rtf[False]), statistics.median(rtf[True])
    row = {
        "audio": AUDIO.name,
        "rounds": args.rounds,
        "rtf_plain": round(plain, 4),
        "rtf_speakers": round(with_sp, 4),
        "ratio_speakers_over_plain": round(with_sp / plain, 3),
        "diarize_s_median": round(statistics.median(diarize), 3),
        "speakers_found": sorted(found),
        "target": "ratio <= 1.25",
        "command": "python " + " ".join(sys.argv),
    }
    if mem:
        row["memory_speakers"] = mem
    print(json.dumps(row, indent=1))
    out = ROOT / "benchmarks" / "results" / "transcribe-speakers.json"
    out.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
