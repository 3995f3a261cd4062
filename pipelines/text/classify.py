"""classify on transformers, and zero-shot text on ONNX Runtime.

Text, zero-shot: embed the inputs and the labels (phrased through --template) with the text-encoder
engine the RUNTIMES row names, then softmax the cosine similarities (scaled as CLIP-style zero-shot
does).
Text, trained head: any *ForSequenceClassification model with its own id2label.
Images: any AutoModelForImageClassification, in pipelines/vision/hf_classify.py.
"""

from __future__ import annotations

import numpy as np

from taskrun.pipelines import cached_model
from taskrun.pipelines.base import Pipeline as Base
from taskrun.pipelines.device import auto_dtype, resolve_dtype
from taskrun.pipelines.text.encoder import auto_runtime, encode
from taskrun.tasks import events as ev
from taskrun.tasks.classify import Label, Metrics, Result
from taskrun.tasks.clock import timed

# Cosine similarities of sentence embeddings sit in a narrow band; a temperature spreads them
# into usable probabilities without changing the order.
ZERO_SHOT_SCALE = 20.0


class ClassifyPipeline(Base):
    task = "classify"
    runtime = "transformers"

    def __init__(self, card, device="auto", dtype="auto", *, engine):
        if card.kind == "sentence-embedding":  # the engine resolves its own device (on ONNX
            self.card = card  # Runtime without importing torch)
            self.impl = _ZeroShot(engine.load(card, device, dtype))
            self.runtime = self.impl.encoder.runtime
            self.device, self.dtype = self.impl.device, self.impl.dtype
            return
        super().__init__(card, device, dtype)
        if card.kind == "text-classification":
            self.impl = _SequenceClassifier(card, self.device, dtype)
        else:
            from taskrun.pipelines.vision.hf_classify import ImageClassifier

            self.impl = ImageClassifier(card, self.device, dtype)
        self.device, self.dtype = self.impl.device, self.impl.dtype

    @classmethod
    def advise_model(cls, card, inputs, options, **kw):
        """Zero-shot text runs on the text-encoder runtime that is fastest here (see auto_runtime)."""
        return auto_runtime(cls.task, card, kw.get("runtime"), kw.get("device", "auto"), kw.get("dtype", "auto")), []

    def run(self, inputs, options, clock):
        n_ok = 0
        for event in timed(self.impl.run(inputs, options), lambda s: clock.add("classify", s)):
            n_ok += isinstance(event, ev.Item)
            yield event
        elapsed = clock.total("classify")  # the classifier's own time, not the consumer's at a yield
        n = max(n_ok, 1)
        yield ev.Done(Metrics(items=n_ok, items_per_s=n_ok / elapsed if elapsed > 0 else 0.0, latency_s=elapsed / n))


class OrtClassifyPipeline(ClassifyPipeline):
    """classify on ONNX Runtime: an image EfficientNet on its ONNX export
    (pipelines/vision/efficientnet_ort.py), or zero-shot text on a sentence encoder's export (the
    embed engine: the default on a CPU without bf16, as for embed; see auto_runtime). Built as one
    or the other, by the model's kind."""

    def __new__(cls, card, device="auto", dtype="auto", *, engine):
        if card.kind == "sentence-embedding":
            return ClassifyPipeline(card, device, dtype, engine=engine)
        from taskrun.pipelines.vision.efficientnet_ort import EfficientNetOrtPipeline

        return EfficientNetOrtPipeline(card, device, dtype)


class _ZeroShot:
    def __init__(self, encoder):
        self.encoder = encoder
        self.device, self.dtype = encoder.device, encoder.dtype

    def run(self, inputs, options):
        labels = list(options.labels)
        label_vecs = encode(self.encoder, [options.template.format(x) for x in labels]).vectors
        vecs = encode(self.encoder, [inp.text for inp in inputs], options.batch_size).vectors
        sims = vecs @ label_vecs.T
        probs = _softmax(sims * ZERO_SHOT_SCALE)
        for i, inp in enumerate(inputs):
            order = np.argsort(-probs[i])
            yield ev.Item(
                i,
                inp.source,
                Result(input=inp.text, zero_shot=True, labels=[Label(labels[j], float(probs[i, j])) for j in order]),
            )


class _SequenceClassifier:
    def __init__(self, card, device, dtype):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = device
        self.torch_dtype, self.dtype = resolve_dtype(dtype, device, auto_dtype(device, prefer_bf16=False))
        self.tokenizer = cached_model(
            card, "transformers", device, self.dtype, "tokenizer", lambda: AutoTokenizer.from_pretrained(card.path)
        )
        self.model = cached_model(
            card,
            "transformers",
            device,
            self.dtype,
            "seq-cls",
            lambda: (
                AutoModelForSequenceClassification.from_pretrained(card.path, dtype=self.torch_dtype).to(device).eval()
            ),
        )

    def run(self, inputs, options):
        import torch

        id2label = self.model.config.id2label
        multi = getattr(self.model.config, "problem_type", None) == "multi_label_classification"
        for start in range(0, len(inputs), options.batch_size):
            chunk = inputs[start : start + options.batch_size]
            enc = self.tokenizer([c.text for c in chunk], padding=True, truncation=True, return_tensors="pt")
            logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits.float()
            probs = torch.sigmoid(logits) if multi else torch.softmax(logits, -1)
            for j, inp in enumerate(chunk):
                p = probs[j].cpu().numpy()
                order = np.argsort(-p)
                yield ev.Item(
                    start + j,
                    inp.source,
                    Result(input=inp.text, labels=[Label(id2label.get(int(k), str(k)), float(p[k])) for k in order]),
                )


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
