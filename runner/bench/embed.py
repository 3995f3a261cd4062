"""`run bench embed`: taskrun embed against sentence-transformers and ONNX Runtime on the same
weights and sentences (the timing is runner/bench/core.py's; the shared pieces are suites.py's).
benchmarks/bench_embed.py builds on ``sentences``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from taskrun.runner.bench.core import Contender
from taskrun.runner.bench.suites import SAMPLES, Suite, missing, offer, pick, taskrun_job
from taskrun.tasks.base import Input, TaskError


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
        out.append(" ".join(words[start : start + k]).capitalize() + ".")
    return out


_FALLBACK_TEXT = (
    "the quick brown fox jumps over the lazy dog while a cat sleeps in the warm sun and "
    "people talk about coffee, planets, meetings and the weather of the coming week "
) * 4


def embed(model: str | None, against: tuple[str, ...], data: list[Path], quick: bool) -> Suite:
    """taskrun embed (default runtime and dtype; and on transformers when that is not the default)
    against sentence-transformers ``encode`` (batch 32, normalised, float32) and ONNX Runtime float32
    on a plain export of the same folder (length-sorted batches of 32, mean pooling in numpy, as
    fastembed runs it); quality is the lowest cosine between taskrun's vectors and each other's."""
    model = model or "minilm"
    texts = (
        [line for p in data for line in Path(p).read_text().splitlines() if line.strip()]
        if data
        else sentences(300 if quick else 2000)
    )
    inputs = [Input(source=f"s{i}", kind="text", text=t) for i, t in enumerate(texts)]
    runtime = _embed_runtime(model)
    suite = Suite(
        "embed",
        model,
        "sentences",
        len(texts),
        [
            Contender(
                "taskrun", taskrun_job("embed", inputs, {}, model), "taskrun", f"default runtime ({runtime}) and dtype"
            )
        ],
    )
    if runtime != "transformers" and pick(against, "taskrun --runtime transformers"):
        suite.contenders.append(
            Contender(
                "taskrun --runtime transformers",
                taskrun_job("embed", inputs, {}, model, runtime="transformers"),
                "taskrun",
                "transformers, default dtype",
            )
        )
    no_st = missing("sentence_transformers")
    offer(
        suite,
        against,
        "sentence-transformers",
        "sentence-transformers is not installed (pip install sentence-transformers)" if no_st else None,
        lambda: Contender("sentence-transformers", _st(model, texts), note="encode, batch 32, float32, normalised"),
    )
    no_ort = missing("onnxruntime") or missing("onnx")
    offer(
        suite,
        against,
        "onnxruntime",
        "the ONNX Runtime reference exports the model first, which needs onnxruntime and onnx (pip install onnx)"
        if no_ort
        else None,
        lambda: Contender(
            "onnxruntime", _ort_embed(model, texts), note="float32, length-sorted batches of 32, default session"
        ),
    )
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
            return self.net(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    net = Plain(AutoModel.from_pretrained(path, dtype=torch.float32).eval())
    ids = torch.ones(2, 8, dtype=torch.long)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(dst),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            opset_version=17,
            dynamo=False,
            dynamic_axes={
                n: {0: "batch", 1: "tokens"}
                for n in ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
            },
        )
    return dst


def ort_embed(session, tokenizer, texts: list[str], batch: int = 32, max_length: int = 256):
    """ONNX Runtime as fastembed runs it: texts sorted by token count, batches padded to their
    longest, mean pooling over the mask and L2 normalisation in numpy; vectors in input order."""
    import numpy as np

    lengths = [len(x) for x in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    out = [None] * len(texts)
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        enc = tokenizer(
            [texts[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="np"
        )
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

        import onnxruntime as ort  # onnxruntime's ~/.cache writes
        from transformers import AutoTokenizer

        from taskrun.models.resolve import resolve
        from taskrun.pipelines.device import configure_threads  # first: taskrun.pipelines turns off

        configure_threads()
        path = resolve(model).path
        with tempfile.TemporaryDirectory(prefix="taskrun-bench-") as tmp:  # the session holds the graph
            session = ort.InferenceSession(
                str(export_plain_encoder(path, Path(tmp) / "model.onnx")), providers=["CPUExecutionProvider"]
            )
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
    return {
        name: {"min_cosine_vs_taskrun": round(float((a * matrix(o)).sum(1).min()), 5)}
        for name, o in outs.items()
        if name != "taskrun"
    }
