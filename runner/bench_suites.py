"""What `run bench TASK` measures: for each task, taskrun's job and the reference a user would
otherwise pick, on the same weights and the same data, plus how close their outputs are.

Each suite returns a :class:`Suite`; runner/bench_core.py does the timing. A reference whose
package is not installed becomes a ``Skipped`` line, never an error. benchmarks/*.py build on the
same functions (sentences, photos, the reference loops), so the numbers in the README and what a
user measures with `run bench` come from one piece of code.
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from taskrun.runner.bench_core import Contender, Skipped
from taskrun.tasks.base import Input, TaskError

ROOT = Path(__file__).resolve().parent.parent  # the source checkout (samples/ lives there)
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


def file_inputs(paths: list[Path], kind: str) -> list[Input]:
    missing_files = [str(p) for p in paths if not Path(p).exists()]
    if missing_files:
        raise TaskError(f"bench input not found: {', '.join(missing_files)}; pass --input FILE")
    return [Input(source=str(p), kind=kind, path=str(p)) for p in paths]


# --------------------------------------------------------------------------- transcribe


def transcribe(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun's default decoding against faster-whisper (sequential greedy and beam 5, and its
    BatchedInferencePipeline) on the same CTranslate2 weights; WER where a reference .txt sits
    beside the audio."""
    import soundfile as sf

    model = model or "whisper-tiny.en"
    paths = data or [SAMPLES / "meeting.wav"]
    inputs = file_inputs(paths, "audio")
    audio_s = sum(sf.info(str(p)).duration for p in paths)
    suite = Suite("transcribe", model, "audio_s", round(audio_s, 3),
                  [Contender("taskrun", taskrun_job("transcribe", inputs, {}, model), "taskrun", "default options"),
                   Contender("taskrun --batch-size 8", taskrun_job("transcribe", inputs, {"batch_size": 8}, model),
                             "taskrun", "windows after the first decoded 8 at a time")])
    settings = [("faster-whisper greedy", 1, False), ("faster-whisper beam 5", 5, False),
                ("faster-whisper batched", 1, True)]
    for name, beam, batched in settings:
        if not pick(against, name):
            continue
        if missing("faster_whisper"):
            suite.skipped.append(Skipped(name, "faster-whisper is not installed (pip install faster-whisper)"))
            continue
        note = f"beam {beam}, {'BatchedInferencePipeline batch 8' if batched else 'vad_filter'}, float32"
        suite.contenders.append(Contender(name, faster_whisper_run(model, paths, beam, batched), note=note))
    refs = {p: p.with_suffix(".txt") for p in paths}
    if all(r.exists() for r in refs.values()):
        suite.quality = lambda outs: _wer(outs, [refs[p].read_text() for p in paths])
    return suite


def faster_whisper_run(model: str, paths: list[Path], beam: int, batched: bool):
    def load():
        import soundfile as sf

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import cpu_threads  # first: taskrun.pipelines turns off
        from faster_whisper import BatchedInferencePipeline, WhisperModel  # onnxruntime's ~/.cache writes

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


# --------------------------------------------------------------------------- embed


def sentences(n: int, seed: int = 0) -> list[str]:
    """Mixed-length English sentences: 3 to ~120 words, built from the sample docs' vocabulary
    (or a fixed vocabulary when the checkout's samples are not there)."""
    rng = random.Random(seed)
    docs = sorted((SAMPLES / "docs").glob("*.md"))
    text = " ".join(p.read_text() for p in docs) or _FALLBACK_TEXT
    words = [w.strip("#*.,;:()") for w in text.split() if w.strip("#*.,;:()")]
    out = []
    for _ in range(n):
        k = int(min(120, max(3, rng.lognormvariate(2.6, 0.8))))
        k = min(k, len(words) - 1)
        start = rng.randrange(len(words) - k)
        out.append(" ".join(words[start:start + k]).capitalize() + ".")
    return out


_FALLBACK_TEXT = ("the quick brown fox jumps over the lazy dog while a cat sleeps in the warm sun and "
                  "people talk about coffee, planets, meetings and the weather of the coming week ") * 4


def embed(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun embed against sentence-transformers ``encode`` (batch 32, normalised), on the
    same folder; quality is the lowest cosine between taskrun's vectors and the reference's."""
    model = model or "minilm"
    texts = [line for p in data for line in Path(p).read_text().splitlines() if line.strip()] if data \
        else sentences(300 if quick else 2000)
    inputs = [Input(source=f"s{i}", kind="text", text=t) for i, t in enumerate(texts)]
    suite = Suite("embed", model, "sentences", len(texts),
                  [Contender("taskrun", taskrun_job("embed", inputs, {}, model), "taskrun", "default dtype")])
    if pick(against, "sentence-transformers"):
        if missing("sentence_transformers"):
            suite.skipped.append(Skipped("sentence-transformers", "sentence-transformers is not installed "
                                                                  "(pip install sentence-transformers)"))
        else:
            suite.contenders.append(Contender("sentence-transformers", _st(model, texts),
                                              note="encode, batch 32, float32, normalised"))
    _skip_onnxruntime(suite, against)
    suite.quality = _cosines
    return suite


def _skip_onnxruntime(suite, against) -> None:
    """ONNX Runtime, asked for by name, is said to be skipped rather than silently left out."""
    if against and pick(against, "onnxruntime"):
        suite.skipped.append(Skipped("onnxruntime", "ONNX Runtime needs an ONNX export of the model, which "
                                                    "taskrun does not ship (no onnx exporter installed); "
                                                    "export it with optimum and time it apart"))


def _st(model: str, texts: list[str]):
    def load():
        from sentence_transformers import SentenceTransformer

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads

        configure_threads()
        st = SentenceTransformer(resolve(model).path, device="cpu")
        return lambda: st.encode(texts, batch_size=32, normalize_embeddings=True)
    return load


def _cosines(outs: dict[str, Any]) -> dict:
    import numpy as np

    ours = outs.get("taskrun")
    if ours is None:
        return {}
    a = np.stack([r.vector for r in ours.results]).astype(np.float32)
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    q = {}
    for name, o in outs.items():
        if name != "taskrun":
            b = np.asarray(o, dtype=np.float32)
            b /= np.linalg.norm(b, axis=1, keepdims=True)
            q[name] = {"min_cosine_vs_taskrun": round(float((a * b).sum(1).min()), 5)}
    return q


# --------------------------------------------------------------------------- classify (images)


def photos(n: int) -> list[Path]:
    """``n`` photos: the checkout's sample photos, repeated."""
    files = sorted((SAMPLES / "images").glob("*.jpg"))
    if not files:
        raise TaskError(f"no sample photos in {SAMPLES / 'images'}; pass --input PHOTO (repeatable)")
    return [files[i % len(files)] for i in range(n)]


def classify(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun classify (batch 16, default dtype) against the plain torch loop from the model's
    README (PIL resize, float32, one image at a time); quality: top-1 agreement."""
    model = model or "efficientnet-lite0"
    files = data or photos(16 if quick else 64)
    inputs = file_inputs(files, "image")
    suite = Suite("classify", model, "images", len(files),
                  [Contender("taskrun", taskrun_job("classify", inputs, {"batch_size": 16, "top_k": 1}, model),
                             "taskrun", "batch 16, default dtype")])
    if pick(against, "torch loop"):
        if model != "efficientnet-lite0" or missing("efficientnet_lite_pytorch"):
            suite.skipped.append(Skipped("torch loop", "the plain torch loop is written for efficientnet-lite0 "
                                                       "(efficientnet-lite-pytorch)"))
        else:
            suite.contenders.append(Contender("torch loop", _torch_loop(model, files),
                                              note="PIL resize, float32, batch 1"))
    _skip_onnxruntime(suite, against)
    suite.quality = _top1
    return suite


def reference_model(path: str):
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name("efficientnet-lite0")
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()


def reference_loop(model, files) -> list[int]:
    """The plain loop: one image at a time, float32, NCHW; the top-1 class index of each."""
    import numpy as np
    import torch
    from PIL import Image

    top1 = []
    with torch.inference_mode():
        for f in files:
            img = Image.open(f).convert("RGB").resize((224, 224), Image.BILINEAR)
            x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)
            top1.append(int(model(x.unsqueeze(0))[0].argmax()))
    return top1


def _torch_loop(model: str, files: list[Path]):
    def load():
        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads

        configure_threads()
        net = reference_model(resolve(model).path)
        return lambda: reference_loop(net, files)
    return load


def _top1(outs: dict[str, Any]) -> dict:
    from taskrun.pipelines.vision.efficientnet import imagenet_labels

    ours, names = outs.get("taskrun"), imagenet_labels()
    if ours is None:
        return {}
    labels = [r.labels[0].label for r in ours.results]
    return {name: {"top1_agreement_with_taskrun": round(sum(names[a] == b for a, b in zip(o, labels)) / len(labels), 4)}
            for name, o in outs.items() if name != "taskrun"}
