"""What `run bench TASK` measures: for each task, taskrun's job and the reference a user would
otherwise pick, on the same weights and the same data, plus how close their outputs are.

Each suite returns a :class:`Suite`; runner/bench/core.py does the timing. A reference whose
package is not installed becomes a ``Skipped`` line, never an error. benchmarks/*.py build on the
same functions (sentences, photos, the reference loops), so the numbers in docs/performance.md and what a
user measures with `run bench` come from one piece of code.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrun.runner.bench.core import Contender, Skipped
from taskrun.tasks.base import Input, TaskError

ROOT = Path(__file__).resolve().parents[2]  # the source checkout (samples/ lives there)
SAMPLES = ROOT / "samples"


@dataclass
class Suite:
    task: str
    model: str
    unit: str  # what throughput counts: audio_s, sentences, images, tokens
    units: float  # how many of them one run does
    contenders: list[Contender]
    skipped: list[Skipped] = field(default_factory=list)
    quality: Callable[[dict[str, Any]], dict] | None = None  # outputs by name → quality by name


def missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def pick(against: tuple[str, ...], name: str) -> bool:
    """Whether the reference ``name`` is asked for (no --against: every one)."""
    return not against or any(a.lower() in name.lower() for a in against)


def taskrun_job(task_name: str, inputs: list[Input], options: dict, model: str, runtime: str | None = None):
    """A contender's loader for a taskrun job: the first call loads the model (into the
    in-process cache), every call runs the whole job through run_job as the CLI does."""

    def load():
        from taskrun.runner.jobs import run_job
        from taskrun.tasks import get_task

        task = get_task(task_name)
        opts = task.Options(**options)

        def run():
            return run_job(task, lambda: inputs, opts, model=model, runtime=runtime, log=None)

        return run

    return load


def offer(suite: Suite, against: tuple[str, ...], name: str, unavailable: str | None, make: Callable[[], Contender]):
    """Add the reference ``name`` when it is asked for; when it cannot run here (``unavailable``
    says why and what to install), a Skipped line says so instead."""
    if not pick(against, name):
        return
    if unavailable:
        suite.skipped.append(Skipped(name, unavailable))
    else:
        suite.contenders.append(make())


def with_env(env: dict[str, str], load):
    """``load`` with ``env`` set first, in the contender's own process (a library such as
    libgomp reads its variables once, when it loads)."""

    def wrapped():
        os.environ.update(env)
        return load()

    return wrapped


def file_inputs(paths: list[Path], kind: str) -> list[Input]:
    missing_files = [str(p) for p in paths if not Path(p).exists()]
    if missing_files:
        raise TaskError(f"bench input not found: {', '.join(missing_files)}; pass --input FILE")
    return [Input(source=str(p), kind=kind, path=str(p)) for p in paths]


# --------------------------------------------------------------------------- transcribe


def transcribe(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun's default decoding (greedy) against faster-whisper (sequential greedy and beam 5, and its
    BatchedInferencePipeline) on the same CTranslate2 weights; WER where a reference .txt sits
    beside the audio."""
    import soundfile as sf

    model = model or "whisper-tiny.en"
    paths = data or [SAMPLES / "meeting.wav"]
    inputs = file_inputs(paths, "audio")
    audio_s = sum(sf.info(str(p)).duration for p in paths)
    suite = Suite(
        "transcribe",
        model,
        "audio_s",
        round(audio_s, 3),
        [
            Contender("taskrun", taskrun_job("transcribe", inputs, {}, model), "taskrun", "default options"),
            Contender(
                "taskrun --beam-size 5",
                taskrun_job("transcribe", inputs, {"beam_size": 5}, model),
                "taskrun",
                "beam 5, the default before it was chosen by WER",
            ),
            Contender(
                "taskrun --batch-size 8",
                taskrun_job("transcribe", inputs, {"batch_size": 8}, model),
                "taskrun",
                "windows after the first decoded 8 at a time",
            ),
            Contender(
                "taskrun passive waits",
                with_env({"TASKRUN_CT2_SPINCOUNT": "0"}, taskrun_job("transcribe", inputs, {}, model)),
                "taskrun",
                "default options, CTranslate2's OpenMP threads waiting passively (the default until 2026-12-01)",
                own_process=True,
            ),
        ],
    )
    settings = [
        ("faster-whisper greedy", 1, False),
        ("faster-whisper beam 5", 5, False),
        ("faster-whisper batched", 1, True),
    ]
    unavailable = "faster-whisper is not installed (pip install faster-whisper)" if missing("faster_whisper") else None
    for name, beam, batched in settings:
        note = f"beam {beam}, {'BatchedInferencePipeline batch 8' if batched else 'vad_filter'}, float32"
        offer(
            suite,
            against,
            name,
            unavailable,
            lambda name=name, beam=beam, batched=batched, note=note: Contender(
                name, faster_whisper_run(model, paths, beam, batched), note=note
            ),
        )
    refs = {p: p.with_suffix(".txt") for p in paths}
    if all(r.exists() for r in refs.values()):
        suite.quality = lambda outs: _wer(outs, [refs[p].read_text() for p in paths])
    return suite


def faster_whisper_run(model: str, paths: list[Path], beam: int, batched: bool):
    def load():
        import soundfile as sf
        from faster_whisper import BatchedInferencePipeline, WhisperModel  # onnxruntime's ~/.cache writes

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import cpu_threads  # first: taskrun.pipelines turns off

        card = resolve(model)
        wm = WhisperModel(card.path, device="cpu", compute_type="float32", cpu_threads=cpu_threads())
        pipe = BatchedInferencePipeline(wm) if batched else None
        language = None if wm.model.is_multilingual else "en"

        def run():
            texts = []
            for p in paths:
                audio, _ = sf.read(str(p), dtype="float32")
                if pipe is not None:
                    segs, _ = pipe.transcribe(audio, beam_size=beam, batch_size=8, language=language)
                else:
                    segs, _ = wm.transcribe(audio, beam_size=beam, vad_filter=True, language=language)
                texts.append(" ".join(s.text.strip() for s in segs))
            return texts

        return run

    return load


def _wer(outs: dict[str, Any], refs: list[str]) -> dict:
    """Word error rate of each contender's text, by tools/wer.py (the measure the transcription
    tests use; it lives in the source checkout, so an installed taskrun reports no WER)."""
    wer_file = ROOT / "tools" / "wer.py"
    if not wer_file.exists():
        return {}
    spec = importlib.util.spec_from_file_location("taskrun_bench_wer", wer_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    wer = mod.wer
    out = {}
    for name, o in outs.items():
        texts = [r.text for r in o.results] if hasattr(o, "results") else o
        words = sum(len(r.split()) for r in refs)
        errors = sum(wer(r, h) * len(r.split()) for r, h in zip(refs, texts))
        out[name] = {"wer": round(errors / max(1, words), 4)}
    return out
