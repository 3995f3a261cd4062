"""generate --json-schema: the prompt that asks for JSON, the guided fill of flat object schemas,
and the validation of the answer. Written over the engine interface (pipelines/llm/engine.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import weakref

from taskrun.pipelines.llm.decode import Decoded, complete
from taskrun.pipelines.llm.sampling import token_mask
from taskrun.tasks import events as ev
from taskrun.tasks.generate import Generation

# Said to the model with --json-schema. Small models follow an explicit instruction and a "{"
# already written as the start of their answer far better than a bare schema.
SCHEMA_SYSTEM = "Answer only with one JSON value that matches this JSON Schema, with no other text:\n{schema}"

PRIMITIVE = ("string", "integer", "number", "boolean")
NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")

_NUMBER_MASKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine → its mask


def schema_prompt(schema, system: str) -> tuple[str, str]:
    """(system, prefix): the system prompt with the schema instruction added, and the start of
    the answer written for the model ("{" for an object)."""
    if schema is None:
        return system, ""
    system = (system + "\n\n" if system else "") + SCHEMA_SYSTEM.format(schema=json.dumps(schema))
    prefix = "{" if schema is True or (isinstance(schema, dict) and schema.get("type") == "object") else ""
    return system, prefix


def validate(res: Generation, schema) -> None:
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


def guided_fill(engine, question, options, system, schema, s, clock, out: Decoded, index):
    """Write the JSON skeleton ourselves and let the model fill each value: strings up to their
    closing quote, numbers from digit tokens only, booleans and enums by the likeliest option.
    The answer is then valid JSON with the schema's keys and types by construction; the
    validator still checks what the skeleton cannot (formats, ranges, patterns). Yields the
    answer's pieces as Token events when streaming; returns the answer."""
    fields = guided_fields(schema)
    budget = max(8, options.max_tokens // len(fields))
    text, cut = "{", False
    if options.stream:
        yield ev.Token("{", index)
    for n, (name, sub) in enumerate(fields):
        piece = ("" if n == 0 else ", ") + json.dumps(name) + ": "
        text += piece
        if options.stream:
            yield ev.Token(piece, index)
        prompt = (question, system, options.raw, options.history)
        kind = "enum" if isinstance(sub.get("enum"), list) else sub.get("type")
        if kind in ("enum", "boolean"):
            value = _choose(engine, prompt, text, sub["enum"] if kind == "enum" else [True, False])
            if out.first_token_at is None:
                out.first_token_at = clock.now()
        else:
            value, part = _write(engine, prompt, text, kind, dataclasses.replace(s, max_tokens=budget), clock)
            _merge(out, part)
            cut = cut or part.finish_reason == "length"
        text += value
        if options.stream:
            yield ev.Token(value, index)
    text += "}"
    if options.stream:
        yield ev.Token("}", index)
    out.finish_reason = "length" if cut else "stop"
    out.text = text
    return text


def _prompt_ids(engine, prompt: tuple, answer: str) -> list[int]:
    """The question (text, system, raw, history) with ``answer`` so far as the answer's start."""
    text, system, raw, history = prompt
    return engine.prompt_ids(text, system, raw, answer, history)


def _choose(engine, prompt, text: str, choices: list) -> str:
    """The likeliest of ``choices`` after the answer so far, as JSON."""
    ids = _prompt_ids(engine, prompt, text)
    scores = [engine.score(ids, engine.encode(json.dumps(c))) for c in choices]
    return json.dumps(choices[max(range(len(choices)), key=scores.__getitem__)])


def _write(engine, prompt, text: str, kind: str, s, clock) -> tuple[str, Decoded]:
    """(JSON value, its decode): a string up to its closing quote, or a number from number tokens
    ("null" when the model wrote none)."""
    if kind == "string":
        quoted = dataclasses.replace(s, stop=('"',))
        part = complete(engine, _prompt_ids(engine, prompt, text + '"'), quoted, clock)
        return json.dumps(part.text), part
    numeric = dataclasses.replace(s, stop=(",", "}", "\n"), allowed=_number_mask(engine))
    part = complete(engine, _prompt_ids(engine, prompt, text), numeric, clock)
    raw = part.text.strip()
    value = raw if NUMBER.fullmatch(raw) else "null"
    if kind == "integer" and "." in value:
        value = value.split(".")[0]
    return value, part


def _merge(out: Decoded, part: Decoded) -> None:
    """Add one value's decode to the answer's: its first token times the answer's first token."""
    if out.first_token_at is None:
        out.first_token_at, out.prefill_s = part.first_token_at, part.prefill_s
    out.token_ids += part.token_ids
    out.decode_s += part.decode_s
    out.decode_steps += part.decode_steps


def _number_mask(engine):
    """Tokens that may continue a JSON number (digits, sign, point) or end it (, } newline)."""
    if engine not in _NUMBER_MASKS:
        _NUMBER_MASKS[engine] = token_mask([
            bool(t) and bool(re.fullmatch(r"[0-9.eE+-]+", t) or t.strip() in (",", "}", ""))
            for t in engine.token_texts()])
    return _NUMBER_MASKS[engine]
