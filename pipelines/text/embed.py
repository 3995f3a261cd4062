"""embed: batched, length-sorted sentence encoding on any text-encoder engine."""

from __future__ import annotations

from taskrun.pipelines.text.encoder import EncoderPipeline, Encoding
from taskrun.tasks import events as ev
from taskrun.tasks.clock import timed
from taskrun.tasks.embed import Embedding, Metrics


class EmbedPipeline(EncoderPipeline):
    task = "embed"

    def run(self, inputs, options, clock):
        texts = [inp.text for inp in inputs]
        enc = Encoding(self.engine, texts, options.batch_size, options.normalize)
        for done in timed(enc.steps(), lambda s: clock.add("encode", s)):
            if len(texts) > options.batch_size:
                yield ev.Progress(done, len(texts), "texts")
        elapsed = clock.total("encode")  # the encoder's own time, not the consumer's at a yield
        for i, inp in enumerate(inputs):
            yield ev.Item(
                i,
                inp.source,
                Embedding(text=inp.text, vector=enc.vectors[i], tokens=enc.tokens[i], truncated=enc.truncated[i]),
            )
        yield ev.Done(
            Metrics(
                items=len(texts),
                input_tokens=sum(enc.tokens),
                items_per_s=len(texts) / elapsed if elapsed > 0 else 0.0,
                dim=int(enc.vectors.shape[1]),
            )
        )
