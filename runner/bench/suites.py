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
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

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
    suite = Suite("transcribe", model, "audio_s", round(audio_s, 3),
                  [Contender("taskrun", taskrun_job("transcribe", inputs, {}, model), "taskrun", "default options"),
                   Contender("taskrun --beam-size 5", taskrun_job("transcribe", inputs, {"beam_size": 5}, model),
                             "taskrun", "beam 5, the default before it was chosen by WER"),
                   Contender("taskrun --batch-size 8", taskrun_job("transcribe", inputs, {"batch_size": 8}, model),
                             "taskrun", "windows after the first decoded 8 at a time"),
                   Contender("taskrun passive waits",
                             with_env({"TASKRUN_CT2_SPINCOUNT": "0"}, taskrun_job("transcribe", inputs, {}, model)),
                             "taskrun", "default options, CTranslate2's OpenMP threads waiting passively "
                             "(the default until 2026-12-01)", own_process=True)])
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
    """taskrun embed (default runtime and dtype; and on transformers when that is not the default)
    against sentence-transformers ``encode`` (batch 32, normalised, float32) and ONNX Runtime float32
    on a plain export of the same folder (length-sorted batches of 32, mean pooling in numpy, as
    fastembed runs it); quality is the lowest cosine between taskrun's vectors and each other's."""
    model = model or "minilm"
    texts = [line for p in data for line in Path(p).read_text().splitlines() if line.strip()] if data \
        else sentences(300 if quick else 2000)
    inputs = [Input(source=f"s{i}", kind="text", text=t) for i, t in enumerate(texts)]
    runtime = _embed_runtime(model)
    suite = Suite("embed", model, "sentences", len(texts),
                  [Contender("taskrun", taskrun_job("embed", inputs, {}, model), "taskrun",
                             f"default runtime ({runtime}) and dtype")])
    if runtime != "transformers" and pick(against, "taskrun --runtime transformers"):
        suite.contenders.append(Contender("taskrun --runtime transformers",
                                          taskrun_job("embed", inputs, {}, model, runtime="transformers"),
                                          "taskrun", "transformers, default dtype"))
    if pick(against, "sentence-transformers"):
        if missing("sentence_transformers"):
            suite.skipped.append(Skipped("sentence-transformers", "sentence-transformers is not installed "
                                                                  "(pip install sentence-transformers)"))
        else:
            suite.contenders.append(Contender("sentence-transformers", _st(model, texts),
                                              note="encode, batch 32, float32, normalised"))
    if pick(against, "onnxruntime"):
        if missing("onnxruntime") or missing("onnx"):
            suite.skipped.append(Skipped("onnxruntime", "the ONNX Runtime reference exports the model first, "
                                                        "which needs onnxruntime and onnx (pip install onnx)"))
        else:
            suite.contenders.append(Contender("onnxruntime", _ort_embed(model, texts),
                                              note="float32, length-sorted batches of 32, default session"))
    suite.quality = _cosines
    return suite


def _embed_runtime(model: str) -> str:
    """The runtime `run embed` picks for ``model`` here (pipelines/text/encoder.py: auto_runtime);
    a model that does not resolve fails when its contender loads, with resolve's own message."""
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.text.encoder import auto_runtime

    try:
        return auto_runtime("embed", resolve(model), None, "auto", "auto").runtime
    except TaskError:
        return "transformers"


def _st(model: str, texts: list[str]):
    def load():
        from sentence_transformers import SentenceTransformer

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads

        configure_threads()
        st = SentenceTransformer(resolve(model).path, device="cpu")
        return lambda: st.encode(texts, batch_size=32, normalize_embeddings=True)
    return load


def export_plain_encoder(path: str, dst: Path) -> Path:
    """The encoder exported the way its users' tools ship it (fastembed, optimum): input_ids,
    attention_mask and token_type_ids in, last_hidden_state out, float32; pooling is left to the
    caller."""
    import warnings

    import torch
    from transformers import AutoModel

    class Plain(torch.nn.Module):  # the tracer passes inputs by position; the model wants names
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.net(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state

    net = Plain(AutoModel.from_pretrained(path, dtype=torch.float32).eval())
    ids = torch.ones(2, 8, dtype=torch.long)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(dst),
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "tokens"} for n in
                                        ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")})
    return dst


def ort_embed(session, tokenizer, texts: list[str], batch: int = 32, max_length: int = 256):
    """ONNX Runtime as fastembed runs it: texts sorted by token count, batches padded to their
    longest, mean pooling over the mask and L2 normalisation in numpy; vectors in input order."""
    import numpy as np

    lengths = [len(x) for x in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    out = [None] * len(texts)
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                        return_tensors="np")
        ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = session.run(None, feeds)[0]
        m = feeds["attention_mask"][..., None].astype(np.float32)
        vec = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        vec /= np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
        for i, v in zip(idx, vec):
            out[i] = v
    return np.stack(out)


def _ort_embed(model: str, texts: list[str]):
    def load():
        import tempfile

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads  # first: taskrun.pipelines turns off

        import onnxruntime as ort  # onnxruntime's ~/.cache writes
        from transformers import AutoTokenizer

        configure_threads()
        path = resolve(model).path
        with tempfile.TemporaryDirectory(prefix="taskrun-bench-") as tmp:  # the session holds the graph
            session = ort.InferenceSession(str(export_plain_encoder(path, Path(tmp) / "model.onnx")),
                                           providers=["CPUExecutionProvider"])
        tokenizer = AutoTokenizer.from_pretrained(path)
        return lambda: ort_embed(session, tokenizer, texts)
    return load


def _cosines(outs: dict[str, Any]) -> dict:
    """The lowest cosine between taskrun's default vectors and each other contender's (a taskrun
    job's record, or a matrix of vectors)."""
    import numpy as np

    def matrix(o):
        m = np.stack([r.vector for r in o.results]) if hasattr(o, "results") else np.asarray(o)
        m = m.astype(np.float32)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    ours = outs.get("taskrun")
    if ours is None:
        return {}
    a = matrix(ours)
    return {name: {"min_cosine_vs_taskrun": round(float((a * matrix(o)).sum(1).min()), 5)}
            for name, o in outs.items() if name != "taskrun"}


# --------------------------------------------------------------------------- classify (images)


def classify(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun classify (batch 16, default runtime and dtype; and on its torch runtime) against
    ONNX Runtime float32 at batch 16 on the same weights (exported to ONNX for the run) and the
    plain torch loop from the model's README, both with the same PIL preprocessing; quality:
    top-1 agreement with taskrun."""
    from taskrun.runner.bench.classify import ort_loop_run, photos, top1_agreement, torch_loop_run

    model = model or "efficientnet-lite0"
    files = data or photos(16 if quick else 64)
    inputs = file_inputs(files, "image")
    opts = {"batch_size": 16, "top_k": 1}
    suite = Suite("classify", model, "images", len(files),
                  [Contender("taskrun", taskrun_job("classify", inputs, opts, model), "taskrun",
                             "batch 16, default runtime and dtype")])
    if _torch_runtime_is_not_default(model):
        suite.contenders.append(Contender("taskrun --runtime torch", taskrun_job("classify", inputs, opts, model,
                                                                                 runtime="torch"),
                                          "taskrun", "batch 16, torch module, default dtype"))
    plain = model == "efficientnet-lite0" and not missing("efficientnet_lite_pytorch")
    if pick(against, "onnxruntime"):
        if not plain or missing("onnxruntime") or missing("onnx"):
            suite.skipped.append(Skipped("onnxruntime", "the ONNX Runtime reference is written for "
                                                        "efficientnet-lite0 and needs onnxruntime and onnx "
                                                        "(pip install onnx) for the export"))
        else:
            suite.contenders.append(Contender("onnxruntime", ort_loop_run(model, files),
                                              note="PIL resize, float32, batch 16, default session"))
    if pick(against, "torch loop"):
        if not plain:
            suite.skipped.append(Skipped("torch loop", "the plain torch loop is written for efficientnet-lite0 "
                                                       "(efficientnet-lite-pytorch)"))
        else:
            suite.contenders.append(Contender("torch loop", torch_loop_run(model, files),
                                              note="PIL resize, float32, batch 1"))
    suite.quality = top1_agreement
    return suite


def _torch_runtime_is_not_default(model: str) -> bool:
    from taskrun.models.resolve import resolve

    card = resolve(model)
    return card.runtime != "torch" and "torch" in card.runtimes
