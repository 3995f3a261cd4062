"""generate: a prompt → streamed text from a causal language model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from taskrun.tasks.base import Task, TaskError, metric, option, require



def load_schema(path: str) -> dict:
    """A JSON Schema file, checked to be valid JSON and a valid schema (before any weights load)."""
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
        raise TaskError(f"--json-schema {path} is not a JSON Schema: it must be an object such as "
                        f'{{"type": "object", "properties": {{...}}}}')
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(x) for x in exc.path) or "top level"
        raise TaskError(f"--json-schema {path} is not a valid JSON Schema ({where}: "
                        f"{exc.message}); fix the schema") from None
    return schema


def check_sampling(max_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    require(max_tokens > 0, f"--max-tokens must be at least 1 (got {max_tokens})")
    require(temperature >= 0, f"--temperature must be 0 (greedy) or more (got {temperature})")
    require(0 < top_p <= 1, f"--top-p must be in (0, 1], e.g. 0.9 (got {top_p})")
    require(top_k >= 0, f"--top-k must be 0 (off) or more (got {top_k})")


def check_history(history, raw: bool) -> tuple[tuple[str, str], ...]:
    """Earlier conversation turns as (role, text) pairs; they need the chat template."""
    turns = tuple(tuple(t) for t in history)
    for t in turns:
        require(len(t) == 2 and t[0] in ("user", "assistant") and isinstance(t[1], str),
                f"history takes (role, text) pairs with role user or assistant (got {list(t)!r:.60})")
    require(not (turns and raw), "a conversation history needs the chat template; drop --raw")
    return turns


@dataclass(frozen=True)
class Options:
    max_tokens: int = option(256, "--max-tokens", help="Most tokens to generate; a longer answer is cut.")
    temperature: float = option(0.0, "--temperature",
                                help="Sampling temperature; 0 = greedy (the same text every run).")
    top_p: float = option(1.0, "--top-p", help="Nucleus sampling: keep the most likely tokens up to this mass.")
    top_k: int = option(0, "--top-k", help="Sample only among the k most likely tokens (0 = off).")
    seed: int | None = option(None, "--seed", help="Random seed for sampling (default: a new one, "
                                                   "reported in the result so the run can be repeated).")
    repeat_penalty: float = option(1.0, "--repeat-penalty",
                                   help="Above 1, makes tokens the answer already holds less likely "
                                        "(1.1-1.3 stops small models looping; 1 = off).")
    stop: tuple[str, ...] = option((), "--stop", multiple=True, metavar="TEXT",
                                   help="Stop when this text appears (not included). Repeatable.")
    system: str = option("", "--system", help="System prompt (used with the chat template).")
    history: tuple = option((), cli=False,
                            help="Earlier turns of a conversation before the prompt, as (role, text) "
                                 "pairs with role user or assistant (the server's chat endpoints).")
    raw: bool = option(False, "--raw", help="Send the prompt as is, without the model's chat template.")
    stream: bool = option(True, "--stream", help="Print text as it is generated (--no-stream: at the end).")
    truncate: bool = option(False, "--truncate",
                            help="Cut a prompt that does not fit the context window instead of refusing it.")
    json_schema: str = option("", "--json-schema", path=True, metavar="FILE",
                              help="Answer in JSON for this schema: flat objects (string, number, boolean, "
                                   "enum fields) are filled by construction, others asked for; "
                                   "always validated.")
    price_in: float = option(0.0, "--price-in", help="Price per million input tokens, for a cost estimate.")
    price_out: float = option(0.0, "--price-out", help="Price per million output tokens, for a cost estimate.")

    def __post_init__(self):
        check_sampling(self.max_tokens, self.temperature, self.top_p, self.top_k)
        require(self.seed is None or self.seed >= 0, f"--seed must be 0 or more (got {self.seed})")
        require(self.repeat_penalty > 0, f"--repeat-penalty must be above 0, e.g. 1.1 (got {self.repeat_penalty})")
        require(all(self.stop), "--stop needs a non-empty text")
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
    schema_valid: bool | None = None  # None without --json-schema
    schema_error: str | None = None
    cost: float | None = None  # estimated, from --price-in/--price-out

    def summary(self) -> str:
        return f"{self.output_tokens} tokens ({self.finish_reason}) {self.text[:60]!r}"


Result = Generation


@dataclass
class Metrics:
    input_tokens: int = metric("prompt tokens, after the chat template (all prompts)", 0)
    output_tokens: int = metric("tokens generated, the end-of-sequence token excluded", 0)
    ttft_s: float = metric("job start (load included) → first token out of the model")
    prefill_s: float = metric("forward pass over the prompt(s), to the first token's logits")
    decode_tokens_per_s: float = metric("tokens after the first ÷ the time from the first to the last")
    finish_reason: str = metric("why generation ended: stop, length or stop_sequence (per prompt, joined)", "")
    cost: float | None = metric("estimated cost from --price-in/--price-out per million tokens", None)


def cut_notice(result, max_tokens: int) -> str:
    """The warning a capped answer carries: it is never presented as complete."""
    if result.finish_reason != "length":
        return ""
    return f"[cut: stopped at the {max_tokens}-token limit; raise --max-tokens for the rest]" \
        if result.output_tokens >= max_tokens else "[cut: the model's context window is full]"


class GenerateTask(Task):
    def render(self, result: Generation, options) -> str:
        tail = self.render_tail(result, options)
        return result.text + ("\n" + tail if tail else "")

    def render_tail(self, result: Generation, options) -> str:
        notes = [cut_notice(result, options.max_tokens if options else 0)]
        if result.truncated_tokens:
            notes.append(f"[prompt truncated: {result.truncated_tokens} tokens dropped to fit the window]")
        if result.schema_valid is False:
            notes.append(f"[JSON schema check FAILED: {result.schema_error}]")
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
    Options=Options, Result=Result, Metrics=Metrics,
    input_kinds=("text",),
    model_kinds="a text-generation (causal LM) model such as smollm2-135m",
    produces="text",
    text_file="whole",
)
