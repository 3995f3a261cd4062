"""generate on transformers: each prompt decoded by the shared streaming loop in pipelines/llm/engine.py."""

from __future__ import annotations

import json
import random
import re

from taskrun.pipelines.base import Pipeline as Base
from taskrun.pipelines.llm.engine import Decoded, Sampling, estimate_cost, load_llm
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.generate import Generation, Metrics, load_schema

# Said to the model with --json-schema. Small models follow an explicit instruction and a "{"
# already written as the start of their answer far better than a bare schema.
SCHEMA_SYSTEM = ("Answer only with one JSON value that matches this JSON Schema, with no other text:\n{schema}")


class GeneratePipeline(Base):
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
                     top_k=options.top_k, seed=seed, stop=tuple(options.stop),
                     repeat_penalty=options.repeat_penalty)
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
            if guided_fields(schema):
                text = yield from guided_fill(llm, inp.text, options, system, schema, s, clock, out, i)
            else:
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
            totals["decode_n"] += out.decode_steps
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


# --------------------------------------------------------------------------- JSON, constrained

PRIMITIVE = ("string", "integer", "number", "boolean")


def guided_fields(schema) -> list[tuple[str, dict]] | None:
    """The (name, schema) fields of a flat object schema that the guided fill can constrain:
    properties that are strings, numbers, booleans or enums. None for anything else (nested
    objects, arrays, ...), which is prompted for and validated only."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or not schema.get("properties"):
        return None
    props = schema["properties"]
    for sub in props.values():
        if not isinstance(sub, dict) or not (isinstance(sub.get("enum"), list) and sub["enum"]
                                             or sub.get("type") in PRIMITIVE):
            return None
    required = [k for k in schema.get("required", []) if k in props]
    return [(k, props[k]) for k in required + [k for k in props if k not in required]]


def _number_mask(llm):
    """Tokens that may continue a JSON number (digits, sign, point) or end it (, } newline)."""
    import torch

    if getattr(llm, "_number_mask", None) is None:
        vocab = llm.tok.convert_ids_to_tokens(list(range(len(llm.tok))))
        ok = torch.zeros(llm.model.config.vocab_size, dtype=torch.bool)
        for i, piece in enumerate(vocab):
            text = llm.tok.convert_tokens_to_string([piece]) if piece else ""
            if text and (re.fullmatch(r"[0-9.eE+-]+", text) or text.strip() in (",", "}", "")):
                ok[i] = i < ok.shape[0]
        llm._number_mask = ok
    return llm._number_mask


def guided_fill(llm, question, options, system, schema, s, clock, out, index):
    """Write the JSON skeleton ourselves and let the model fill each value: strings up to their
    closing quote, numbers from digit tokens only, booleans and enums by the likeliest option.
    The answer is then valid JSON with the schema's keys and types by construction; the
    validator still checks what the skeleton cannot (formats, ranges, patterns)."""
    import dataclasses

    fields = guided_fields(schema)
    budget = max(8, options.max_tokens // len(fields))
    text, first = "{", True
    cut = False
    if options.stream:
        yield ev.Token("{", index)
    for name, sub in fields:
        piece = ("" if first else ", ") + json.dumps(name) + ": "
        first = False
        text += piece
        if options.stream:
            yield ev.Token(piece, index)
        ids = llm.prompt_ids(question, system, options.raw, text)
        kind = "enum" if isinstance(sub.get("enum"), list) else sub.get("type")
        if kind in ("enum", "boolean"):
            choices = sub["enum"] if kind == "enum" else [True, False]
            scores = [llm.score(ids, llm.tok.encode(json.dumps(c), add_special_tokens=False)) for c in choices]
            value = json.dumps(choices[max(range(len(choices)), key=scores.__getitem__)])
            if out.first_token_at is None:
                out.first_token_at = clock.now()
        else:
            part = Decoded()
            if kind == "string":
                ids = llm.prompt_ids(question, system, options.raw, text + '"')
                sv = dataclasses.replace(s, max_tokens=budget, stop=('"',))
            else:
                sv = dataclasses.replace(s, max_tokens=budget, stop=(",", "}", "\n"), allowed=_number_mask(llm))
            for _ in llm.stream(ids, sv, clock, part):
                pass
            if out.first_token_at is None:
                out.first_token_at, out.prefill_s = part.first_token_at, part.prefill_s
            out.token_ids += part.token_ids
            out.decode_s += part.decode_s
            out.decode_steps += part.decode_steps
            cut = cut or part.finish_reason == "length"
            if kind == "string":
                value = json.dumps(part.text)
            else:
                raw = part.text.strip()
                value = raw if re.fullmatch(r"-?\d+(\.\d+)?([eE][+-]?\d+)?", raw) else "null"
                if kind == "integer" and "." in value:
                    value = value.split(".")[0]
        text += value
        if options.stream:
            yield ev.Token(value, index)
    text += "}"
    if options.stream:
        yield ev.Token("}", index)
    out.finish_reason = "length" if cut else "stop"
    out.text = text
    return text

