"""embed on transformers: batched, length-sorted sentence encoding."""

from __future__ import annotations

from taskrun.pipelines.base import Pipeline as Base
from taskrun.pipelines.text.encoder import text_encoder
from taskrun.tasks import events as ev
from taskrun.tasks.embed import Embedding, Metrics


class EmbedPipeline(Base):
    task = "embed"
    runtime = "transformers"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        self.encoder = text_encoder(card, device, dtype)
        self.device, self.dtype = self.encoder.device, self.encoder.dtype

    def run(self, inputs, options, clock):
        texts = [inp.text for inp in inputs]
        steps = self.encoder.encode_steps(texts, options.batch_size, options.normalize)
        while True:
            try:
                with clock.scope("encode"):
                    done = next(steps)
            except StopIteration as stop:
                vecs, tokens, truncated = stop.value
                break
            if len(texts) > options.batch_size:
                yield ev.Progress(done, len(texts), "texts")
        elapsed = clock.total("encode")  # the encoder's own time, not the consumer's at a yield
        for i, inp in enumerate(inputs):
            yield ev.Item(i, inp.source, Embedding(text=inp.text, vector=vecs[i], tokens=tokens[i],
                                                   truncated=truncated[i]))
        yield ev.Done(Metrics(items=len(texts), input_tokens=sum(tokens),
                              items_per_s=len(texts) / elapsed if elapsed > 0 else 0.0,
                              dim=int(vecs.shape[1])))
