"""generate: a prompt → streamed text from a causal language model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from taskrun.tasks.base import Task, TaskError, metric, option, require

# --repeat-penalty's range: 1 is off; far below it a penalised logit overflows (1e-300 made the
# sampler's probabilities nan, a server error), and nobody rewards repetition a hundredfold
REPEAT_PENALTY = (0.01, 100.0)

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# How the JSON is laid out: json.dumps's separators (what models saw most), no other whitespace (a
# grammar that allowed it would let a weak model pad forever).
# the layout the model writes JSON in: compact, as json.dumps with its default separators writes it
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def load_schema(path: str) -> dict | bool:
    """A JSON Schema file, checked to be valid JSON, a valid schema and one the grammar engine can
    enforce (before any weights load)."""
    p = Path(path)
    require(p.is_file(), f"--json-schema {path}: no such file; give a JSON Schema file")
    try:
        schema = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(f"--json-schema {path} is not valid JSON ({exc}); fix the file") from None
    try:
        import jsonschema
    except ImportError:
        raise TaskError("--json-schema needs the jsonschema package: pip install jsonschema") from None
    if not isinstance(schema, (dict, bool)):
        raise TaskError(
            f"--json-schema {path} is not a JSON Schema: it must be an object such as "
            f'{{"type": "object", "properties": {{...}}}}'
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(x) for x in exc.path) or "top level"
        raise TaskError(
            f"--json-schema {path} is not a valid JSON Schema ({where}: {exc.message}); fix the schema"
        ) from None
    schema_grammar(schema, path)
    return schema


def schema_grammar(schema, path: str = "the schema") -> str:
    """The llguidance grammar that makes any answer valid for ``schema`` (pipelines/llm/grammar.py).
    A schema outside the subset llguidance enforces (``not``, ``if``/``then``, ``uniqueItems``,
    ...) or with a ``$ref`` it cannot resolve is refused here, naming the keyword: it would
    otherwise be prompted for and hoped for. The subset: github.com/guidance-ai/llguidance,
    docs/json_schema.md."""
    from llguidance import LLMatcher

    require(schema is not False, f"--json-schema {path} is `false`: no answer can match it")
    schema = {} if schema is True else schema
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_LAYOUT)
    except ValueError as exc:
        raise TaskError(f"--json-schema {path}: {exc}; fix the schema") from None
    error = LLMatcher.validate_grammar(grammar)
    if error and "$ref" in json.dumps(schema) and ("Pointer" in error or "Resource" in error):
        raise TaskError(
            f"--json-schema {path} has a $ref that cannot be resolved ({error.strip()}); "
            f"only references inside the file (#/$defs/...) are followed"
        )
    if error:
        raise TaskError(
            f"--json-schema {path} cannot be enforced while decoding: {error.strip()}; remove or rewrite what it names"
        )
    return grammar


def check_sampling(max_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    require(max_tokens > 0, f"--max-tokens must be at least 1 (got {max_tokens})")
    require(
        0 <= temperature < float("inf"),
        f"--temperature must be 0 (greedy) or a finite number above it, e.g. 0.7 (got {temperature})",
    )
    require(0 < top_p <= 1, f"--top-p must be in (0, 1], e.g. 0.9 (got {top_p})")
    require(top_k >= 0, f"--top-k must be 0 (off) or more (got {top_k})")


def check_history(history, raw: bool) -> tuple[tuple[str, str], ...]:
    """Earlier conversation turns as (role, text) pairs; they need the chat template."""
    turns = tuple(tuple(t) for t in history)
    for t in turns:
        require(
            len(t) == 2 and t[0] in ("user", "assistant") and isinstance(t[1], str),
            f"history takes (role, text) pairs with role user or assistant (got {list(t)!r:.60})",
        )
    require(not (turns and raw), "a conversation history needs the chat template; drop --raw")
    return turns


@dataclass(frozen=True)
class Options:
    max_tokens: int = option(256, "--max-tokens", help="Most tokens to generate; a longer answer is cut.")
    temperature: float = option(
        0.0, "--temperature", help="Sampling temperature; 0 = greedy (the same text every run)."
    )
    top_p: float = option(1.0, "--top-p", help="Nucleus sampling: keep the most likely tokens up to this mass.")
    top_k: int = option(0, "--top-k", help="Sample only among the k most likely tokens (0 = off).")
    seed: int | None = option(
        None,
        "--seed",
        help="Random seed for sampling (default: a new one, reported in the result so the run can be repeated).",
    )
    repeat_penalty: float = option(
        1.0,
        "--repeat-penalty",
        help="Above 1, makes tokens the answer already holds less likely "
        "(1.1-1.3 stops small models looping; 1 = off; 0.01 to 100).",
    )
    stop: tuple[str, ...] = option(
        (), "--stop", multiple=True, metavar="TEXT", help="Stop when this text appears (not included). Repeatable."
    )
    system: str = option("", "--system", help="System prompt (used with the chat template).")
    history: tuple = option(
        (),
        cli=False,
        help="Earlier turns of a conversation before the prompt, as (role, text) "
        "pairs with role user or assistant (the server's chat endpoints).",
    )
    raw: bool = option(False, "--raw", help="Send the prompt as is, without the model's chat template.")
    stream: bool = option(True, "--stream", help="Print text as it is generated (--no-stream: at the end).")
    truncate: bool = option(
        False, "--truncate", help="Cut a prompt that does not fit the context window instead of refusing it."
    )
    context: int = option(
        0,
        "--context",
        help="This job's context window in tokens (prompt + answer), at most the model's own "
        "(0: the model's; more is cut to it, with a note). Ollama's options.num_ctx.",
    )
    json_schema: str = option(
        "",
        "--json-schema",
        path=True,
        metavar="FILE",
        help="Answer in JSON valid for this schema, by construction: each token is "
        "held to a grammar built from it (llguidance's JSON Schema subset; "
        "others are refused); then validated.",
    )
    draft: str = option(
        "",
        "--draft",
        metavar="MODEL",
        help="A small model of the same tokenizer that proposes tokens for this one to verify "
        "(speculative decoding, llama.cpp; the same text at --temperature 0, faster). Default: the "
        "model's `draft` in models.toml; `none` turns it off.",
    )
    draft_tokens: int = option(
        0, "--draft-tokens", help="Tokens the draft proposes per step (0 = adaptive: more while they are accepted)."
    )
    price_in: float = option(0.0, "--price-in", help="Price per million input tokens, for a cost estimate.")
    price_out: float = option(0.0, "--price-out", help="Price per million output tokens, for a cost estimate.")

    def __post_init__(self):
        check_sampling(self.max_tokens, self.temperature, self.top_p, self.top_k)
        require(self.seed is None or self.seed >= 0, f"--seed must be 0 or more (got {self.seed})")
        require(
            REPEAT_PENALTY[0] <= self.repeat_penalty <= REPEAT_PENALTY[1],
            f"--repeat-penalty must be from {REPEAT_PENALTY[0]:g} to {REPEAT_PENALTY[1]:g}, e.g. 1.1 "
            f"(got {self.repeat_penalty})",
        )
        require(all(self.stop), "--stop needs a non-empty text")
        require(self.draft_tokens >= 0, f"--draft-tokens must be 0 (adaptive) or more (got {self.draft_tokens})")
        require(self.price_in >= 0 and self.price_out >= 0, "--price-in/--price-out must be 0 or more")
        object.__setattr__(self, "history", check_history(self.history, self.raw))
        if self.json_schema:
            load_schema(self.json_schema)


@dataclass
class Generation:
    prompt: str
    text: str
    finish_reason: str  # stop (end of sequence) | length (hit --max-tokens or the window) | stop_sequence
    input_tokens: int
    output_tokens: int
    seed: int  # the seed used: the same seed and settings give the same text
    truncated_tokens: int = 0  # prompt tokens dropped by --truncate
    json: object = None  # the parsed answer, with --json-schema
    schema_valid: bool | None = None  # True: the answer passed --json-schema's check (None without one)
    cost: float | None = None  # estimated, from --price-in/--price-out

    def summary(self) -> str:
        return f"{self.output_tokens} tokens ({self.finish_reason}) {self.text[:60]!r}"


Result = Generation


@dataclass
class Metrics:
    input_tokens: int = metric("prompt tokens, after the chat template (all prompts)", 0)
    cached_prompt_tokens: int = metric(
        "of input_tokens, those whose KV cache was kept from the model's "
        "previous sequence, an earlier job's or an earlier prompt's of "
        "this one (a shared prefix, not read again; llama.cpp)",
        0,
    )
    output_tokens: int = metric("tokens generated, the end-of-sequence token excluded", 0)
    ttft_s: float = metric("job start (load included) → first token out of the model")
    prefill_s: float = metric("forward pass over the prompt(s), to the first token's logits")
    decode_tokens_per_s: float = metric("tokens after the first ÷ the time from the first to the last")
    draft_tokens: int = metric("tokens a draft model proposed (--draft, speculative decoding)", 0)
    accepted_draft_tokens: int = metric("of draft_tokens, those the model accepted", 0)
    draft_acceptance: float = metric("accepted_draft_tokens ÷ draft_tokens (0 without a draft)", 0.0)
    draft_stopped: int = metric(
        "answers whose adaptive draft stopped because speculation was slower than the model alone here", 0
    )
    finish_reason: str = metric("why generation ended: stop, length or stop_sequence (per prompt, joined)", "")
    cost: float | None = metric("estimated cost from --price-in/--price-out per million tokens", None)


def cut_notice(result, max_tokens: int) -> str:
    """The warning a capped answer carries: it is never presented as complete."""
    if result.finish_reason != "length":
        return ""
    return (
        f"[cut: stopped at the {max_tokens}-token limit; raise --max-tokens for the rest]"
        if result.output_tokens >= max_tokens
        else "[cut: the model's context window is full]"
    )


class GenerateTask(Task):
    def render(self, result: Generation, options) -> str:
        tail = self.render_tail(result, options)
        return result.text + ("\n" + tail if tail else "")

    def render_tail(self, result: Generation, options) -> str:
        notes = [cut_notice(result, options.max_tokens if options else 0)]
        if result.truncated_tokens:
            notes.append(f"[prompt truncated: {result.truncated_tokens} tokens dropped to fit the window]")
        if result.cost is not None:
            notes.append(f"[estimated cost {result.cost:.6f}]")
        return "\n".join(n for n in notes if n)

    def handoff(self, result: Generation) -> str:
        return result.text


TASK = GenerateTask(
    name="generate",
    summary="Generate text from a prompt with a language model, streamed as it is produced.",
    takes="a prompt: an argument (quote it), a file (-f, read whole) or stdin",
    returns="the generated text with its finish reason (stop, length, stop_sequence) and token counts",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("text",),
    model_kinds="a text-generation (causal LM) model such as smollm2-135m",
    produces="text",
    text_file="whole",
)
