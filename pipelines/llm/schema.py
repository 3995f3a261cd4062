"""generate --json-schema above the decode loop: the instruction that tells the model what to
write, and the check of what it wrote. The grammar that holds every token to the schema is
pipelines/llm/grammar.py, applied by the decode loop itself.
"""

from __future__ import annotations

import json

from taskrun.tasks.base import TaskError
from taskrun.tasks.generate import Generation

# Said to the model with --json-schema. The grammar makes any answer valid; the instruction makes
# it a sensible one (the model knows which fields it is filling).
SCHEMA_SYSTEM = "Answer only with one JSON value that matches this JSON Schema, with no other text:\n{schema}"


def schema_system(schema, system: str) -> str:
    """The system prompt with the schema instruction added."""
    if schema is None:
        return system
    return (system + "\n\n" if system else "") + SCHEMA_SYSTEM.format(schema=json.dumps(schema, separators=(",", ":")))


def validate(res: Generation, schema, max_tokens: int) -> None:
    """Parse and validate the answer: the last check after the grammar. A failure (an answer cut
    at --max-tokens before its JSON closed, or a keyword the grammar enforces loosely, such as a
    ``format``) fails the input, with the answer's start in the message."""
    import jsonschema

    try:
        value = json.loads(res.text)
    except json.JSONDecodeError as exc:
        problem = f"it is not valid JSON ({exc.msg} at char {exc.pos})"
    else:
        errors = sorted(jsonschema.validators.validator_for(schema)(schema).iter_errors(value), key=str)
        if not errors:
            res.json, res.schema_valid = value, True
            return
        where = "/".join(str(x) for x in errors[0].path) or "top level"
        problem = f"{where}: {errors[0].message}"
    fix = (
        f"it was cut at the {max_tokens}-token limit before the JSON closed: raise --max-tokens"
        if res.finish_reason == "length" and res.output_tokens >= max_tokens
        else "the context window filled before the JSON closed: shorten the prompt or the schema"
        if res.finish_reason == "length"
        else "a --stop text cut it: drop --stop"
        if res.finish_reason == "stop_sequence"
        else "simplify the schema or try another --seed"
    )
    raise TaskError(f"the answer does not match --json-schema ({problem}); {fix}. The answer began: {res.text[:160]!r}")
