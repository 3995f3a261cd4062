"""generate on any LLM engine: each prompt decoded by the shared streaming loop
(pipelines/llm/decode.py); --json-schema answers are guided and checked by pipelines/llm/schema.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from taskrun.pipelines.llm.decode import Decoded
from taskrun.pipelines.llm.engine import LLMEngine
from taskrun.pipelines.llm.pipeline import LLMPipeline, per_input
from taskrun.pipelines.llm.sampling import Sampling
from taskrun.pipelines.llm.schema import guided_fields, guided_fill, schema_prompt, validate
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.generate import Generation, Metrics, load_schema


class GeneratePipeline(LLMPipeline):
    task = "generate"

    def run(self, inputs, options, clock):
        schema = load_schema(options.json_schema) if options.json_schema else None
        seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
        s = Sampling(max_tokens=options.max_tokens, temperature=options.temperature, top_p=options.top_p,
                     top_k=options.top_k, seed=seed, stop=tuple(options.stop),
                     repeat_penalty=options.repeat_penalty)
        system, prefix = schema_prompt(schema, options.system)
        totals = _Totals()

        def one(i, inp):
            ids, dropped = self._prompt(inp.text, options, system, prefix)
            out = Decoded()
            if guided_fields(schema):
                text = yield from guided_fill(self.engine, inp.text, options, system, schema, s, clock, out, i)
            else:
                text = yield from self._answer(ids, prefix, s, clock, out, i, options.stream)
            totals.add(len(ids), out)
            n_out = len(out.token_ids)
            res = Generation(prompt=inp.text, text=text, finish_reason=out.finish_reason,
                             input_tokens=len(ids), output_tokens=n_out, seed=seed, truncated_tokens=dropped,
                             cost=estimate_cost(len(ids), n_out, options.price_in, options.price_out))
            if schema is not None:
                validate(res, schema)
            return res

        yield from per_input(inputs, one)
        yield ev.Done(totals.metrics(options))

    def _answer(self, ids, prefix, s, clock, out, index, stream):
        """Decode one answer, its pieces as Token events when streaming; returns its text."""
        if prefix and stream:
            yield ev.Token(prefix, index)
        for piece in self.engine.stream(ids, s, clock, out):
            if stream:
                yield ev.Token(piece, index)
        return prefix + out.text

    def _prompt(self, text, options, system, prefix):
        """The prompt's token ids, refused (or cut with --truncate) when it leaves no room to answer."""
        llm = self.engine
        ids = llm.prompt_ids(text, system, options.raw, prefix, options.history)
        window = llm.context
        if len(ids) < window:
            return ids, 0
        if not options.truncate:
            raise TaskError(f"the prompt is {len(ids)} tokens; {self.card.name} reads at most {window} "
                            f"(prompt + answer). Shorten it, or pass --truncate to cut its end")
        room = max(1, min(options.max_tokens, window // 4))  # leave the answer some room
        return fit_prompt(llm, text, window - room, system, options.raw, prefix, options.history)


@dataclass
class _Totals:
    """The job's sums over its answers, for its metrics."""

    input_tokens: int = 0
    output_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    ttft_s: float | None = None  # the first answer's first token, on the job's clock
    reasons: list[str] = field(default_factory=list)

    def add(self, input_tokens: int, out: Decoded) -> None:
        if self.ttft_s is None and out.first_token_at is not None:
            self.ttft_s = out.first_token_at
        self.input_tokens += input_tokens
        self.output_tokens += len(out.token_ids)
        self.prefill_s += out.prefill_s
        self.decode_steps += out.decode_steps
        self.decode_s += out.decode_s
        self.reasons.append(out.finish_reason)

    def metrics(self, options) -> Metrics:
        return Metrics(
            input_tokens=self.input_tokens, output_tokens=self.output_tokens, ttft_s=self.ttft_s or 0.0,
            prefill_s=self.prefill_s,
            decode_tokens_per_s=self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0,
            finish_reason=",".join(dict.fromkeys(self.reasons)),
            cost=estimate_cost(self.input_tokens, self.output_tokens, options.price_in, options.price_out))


def fit_prompt(llm: LLMEngine, text: str, budget: int, system: str = "", raw: bool = False,
               prefix: str = "", history: tuple = ()) -> tuple[list[int], int]:
    """(ids, dropped): the prompt with the end of ``text`` cut so that it takes at most
    ``budget`` tokens; ``dropped`` counts the text tokens removed."""
    ids = llm.prompt_ids(text, system, raw, prefix, history)
    if len(ids) <= budget:
        return ids, 0
    body = llm.encode(text)
    overhead = len(ids) - len(body)
    keep = budget - overhead
    if keep <= 0:
        raise TaskError(f"the template and system prompt alone take {overhead} tokens, more than "
                        f"the {budget} available; shorten --system or lower --max-tokens")
    ids = llm.prompt_ids(llm.decode(body[:keep], skip_special=False), system, raw, prefix, history)
    while len(ids) > budget and keep > 0:  # re-tokenising at the cut can add a token or two
        keep -= max(1, len(ids) - budget)
        ids = llm.prompt_ids(llm.decode(body[:keep], skip_special=False), system, raw, prefix, history)
    return ids, len(body) - keep


def estimate_cost(input_tokens: int, output_tokens: int, price_in: float, price_out: float) -> float | None:
    """Estimated cost in the price's currency, prices per million tokens; None when unpriced."""
    if not price_in and not price_out:
        return None
    return input_tokens * price_in / 1e6 + output_tokens * price_out / 1e6
