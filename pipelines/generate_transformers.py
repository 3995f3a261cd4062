"""generate on transformers: each prompt decoded by the shared streaming loop in pipelines/llm.py."""

from __future__ import annotations

import json
import random

from pipelines.base import Pipeline as Base
from pipelines.llm import Decoded, Sampling, estimate_cost, load_llm
from tasks import events as ev
from tasks.base import TaskError
from tasks.generate import Generation, Metrics, load_schema

# Said to the model with --json-schema. Small models follow an explicit instruction and a "{"
# already written as the start of their answer far better than a bare schema.
SCHEMA_SYSTEM = ("Answer only with one JSON value that matches this JSON Schema, with no other text:\n{schema}")


class Pipeline(Base):
    task = "generate"
    runtime = "transformers"

    def __init__(self, card, device="auto", dtype="auto"):
        super().__init__(card, device, dtype)
        self.llm = load_llm(card, self.device, dtype)
        self.dtype = self.llm.dtype

    def run(self, inputs, options, clock):
        llm = self.llm
        schema = load_schema(options.json_schema) if options.json_schema else None
        seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
        s = Sampling(max_tokens=options.max_tokens, temperature=options.temperature, top_p=options.top_p,
                     top_k=options.top_k, seed=seed, stop=tuple(options.stop))
        system, prefix = options.system, ""
        if schema is not None:
            system = (system + "\n\n" if system else "") + SCHEMA_SYSTEM.format(schema=json.dumps(schema))
            prefix = "{" if schema is True or (isinstance(schema, dict) and schema.get("type") == "object") else ""
        totals = {"in": 0, "out": 0, "prefill": 0.0, "decode_n": 0, "decode_s": 0.0}
        ttft, reasons = None, []
        for i, inp in enumerate(inputs):
            try:
                ids, dropped = self._prompt(inp.text, options, system, prefix)
            except TaskError as exc:
                if len(inputs) == 1:
                    raise
                yield ev.ItemError(i, inp.source, str(exc))
                continue
            out = Decoded()
            if prefix and options.stream:
                yield ev.Token(prefix, i)
            for piece in llm.stream(ids, s, clock, out):
                if options.stream:
                    yield ev.Token(piece, i)
            text = prefix + out.text
            if ttft is None and out.first_token_at is not None:
                ttft = out.first_token_at
            n_out = len(out.token_ids)
            totals["in"] += len(ids)
            totals["out"] += n_out
            totals["prefill"] += out.prefill_s
            totals["decode_n"] += max(0, n_out - 1)
            totals["decode_s"] += out.decode_s
            reasons.append(out.finish_reason)
            res = Generation(prompt=inp.text, text=text, finish_reason=out.finish_reason,
                             input_tokens=len(ids), output_tokens=n_out, seed=seed, truncated_tokens=dropped,
                             cost=estimate_cost(len(ids), n_out, options.price_in, options.price_out))
            if schema is not None:
                _validate(res, schema)
            yield ev.Item(i, inp.source, res)
        yield ev.Done(Metrics(
            input_tokens=totals["in"], output_tokens=totals["out"], ttft_s=ttft or 0.0,
            prefill_s=totals["prefill"],
            decode_tokens_per_s=totals["decode_n"] / totals["decode_s"] if totals["decode_s"] > 0 else 0.0,
            finish_reason=",".join(dict.fromkeys(reasons)),
            cost=estimate_cost(totals["in"], totals["out"], options.price_in, options.price_out)))

    def _prompt(self, text, options, system, prefix):
        """The prompt's token ids, refused (or cut with --truncate) when it leaves no room to answer."""
        llm = self.llm
        ids = llm.prompt_ids(text, system, options.raw, prefix)
        window = llm.context
        if len(ids) < window:
            return ids, 0
        if not options.truncate:
            raise TaskError(f"the prompt is {len(ids)} tokens; {self.card.name} reads at most {window} "
                            f"(prompt + answer). Shorten it, or pass --truncate to cut its end")
        room = max(1, min(options.max_tokens, window // 4))  # leave the answer some room
        return llm.fit_prompt(text, window - room, system, options.raw, prefix)


def _validate(res: Generation, schema) -> None:
    """Parse and validate the answer; a failure is recorded in the result, never hidden."""
    import jsonschema

    try:
        value = json.loads(res.text)
    except json.JSONDecodeError as exc:
        res.schema_valid, res.schema_error = False, f"not valid JSON ({exc.msg} at char {exc.pos})"
        return
    res.json = value
    errors = sorted(jsonschema.validators.validator_for(schema)(schema).iter_errors(value), key=str)
    if errors:
        where = "/".join(str(x) for x in errors[0].path) or "top level"
        res.schema_valid, res.schema_error = False, f"{where}: {errors[0].message}"
    else:
        res.schema_valid = True
