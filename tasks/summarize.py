"""summarize: a text (or a transcript handed on by a chain) → a shorter text.

Input longer than the model's window is split into chunks that fit, each chunk summarised, and
the summaries summarised again (map-reduce); every stage's numbers are kept in the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskrun.tasks.base import Task, metric, option, require
from taskrun.tasks.generate import check_sampling, cut_notice

# Answer budget and the words put in the instruction, per --length.
LENGTHS = {
    "short": (96, "in two or three sentences"),
    "medium": (192, "in one short paragraph"),
    "long": (384, "in a few paragraphs, keeping every decision, name and number"),
}


@dataclass(frozen=True)
class Options:
    length: str = option(
        "medium",
        "--length",
        choices=tuple(LENGTHS),
        help="How long a summary: short (2-3 sentences), medium (a paragraph), long.",
    )
    max_tokens: int = option(0, "--max-tokens", help="Most tokens in the summary (default: from --length).")
    temperature: float = option(0.0, "--temperature", help="Sampling temperature; 0 = greedy.")
    top_p: float = option(1.0, "--top-p", help="Nucleus sampling mass.")
    seed: int = option(0, "--seed", help="Random seed for sampling.")
    repeat_penalty: float = option(
        1.15, "--repeat-penalty", help="Above 1, makes tokens already in the summary less likely (1 = off)."
    )
    context: int = option(
        0,
        "--context",
        metavar="TOKENS",
        help="Use at most this much of the model's window (0: all); "
        "input beyond it is summarised in chunks (map-reduce).",
    )
    stream: bool = option(True, "--stream", help="Print the final summary as it is generated.")
    draft: str = option(
        "",
        "--draft",
        metavar="MODEL",
        help="A small model of the same tokenizer that proposes tokens for this one to verify "
        "(speculative decoding, llama.cpp). Default: the model's `draft` in models.toml; `none`: off.",
    )
    draft_tokens: int = option(
        0, "--draft-tokens", help="Tokens the draft proposes per step (0 = adaptive: more while they are accepted)."
    )

    def __post_init__(self):
        require(self.max_tokens >= 0, f"--max-tokens must be at least 1, or 0 for --length's (got {self.max_tokens})")
        check_sampling(self.max_tokens or 1, self.temperature, self.top_p, 0)
        require(self.repeat_penalty > 0, f"--repeat-penalty must be above 0, e.g. 1.1 (got {self.repeat_penalty})")
        require(
            self.context == 0 or self.context >= 128,
            f"--context must be 0 (the whole window) or at least 128 tokens (got {self.context})",
        )
        require(self.draft_tokens >= 0, f"--draft-tokens must be 0 (adaptive) or more (got {self.draft_tokens})")

    @property
    def answer_tokens(self) -> int:
        return self.max_tokens or LENGTHS[self.length][0]


@dataclass
class Summary:
    text: str
    finish_reason: str  # of the final stage: stop | length | stop_sequence
    input_tokens: int  # tokens of the source text
    output_tokens: int  # tokens of the final summary
    chunks: int = 1  # pieces the input was split into (1: it fitted the window)
    stages: int = 1  # 1 = one pass; 2+ = map-reduce rounds plus the final summary

    def summary(self) -> str:
        return f"{self.output_tokens} tokens from {self.input_tokens} ({self.chunks} chunks) {self.text[:50]!r}"


Result = Summary


@dataclass
class Metrics:
    input_tokens: int = metric("prompt tokens over all stages (chunks, partial summaries, final)", 0)
    cached_prompt_tokens: int = metric(
        "of input_tokens, those whose KV cache was kept from the model's "
        "previous sequence, an earlier stage's or an earlier job's (a "
        "shared prefix, such as the instruction before each chunk, not "
        "read again; llama.cpp)",
        0,
    )
    output_tokens: int = metric("tokens generated over all stages", 0)
    ttft_s: float = metric("job start → first token of the FINAL summary (what a user waits for)")
    prefill_s: float = metric("forward passes over all stages' prompts")
    decode_tokens_per_s: float = metric("tokens after each stage's first ÷ their decode time, all stages")
    draft_tokens: int = metric("tokens a draft model proposed, all stages (--draft, speculative decoding)", 0)
    accepted_draft_tokens: int = metric("of draft_tokens, those the model accepted", 0)
    draft_acceptance: float = metric("accepted_draft_tokens ÷ draft_tokens (0 without a draft)", 0.0)
    draft_stopped: int = metric(
        "stages whose adaptive draft stopped because speculation was slower than the model alone here", 0
    )
    finish_reason: str = metric("why the final summary ended: stop, length or stop_sequence", "")
    chunks: int = metric("chunks the input was split into (1: it fitted)", 0)
    stages: list = metric(
        "per stage: kind (map1, map2, final), chunk, input/output tokens, "
        "cached_prompt_tokens, prefill_s, decode_s, decode_steps, draft_tokens, accepted_draft_tokens, draft_stopped_at, finish_reason",
        None,
    )


class SummarizeTask(Task):
    def render(self, result: Summary, options) -> str:
        tail = self.render_tail(result, options)
        return result.text + ("\n" + tail if tail else "")

    def render_tail(self, result: Summary, options) -> str:
        notes = [cut_notice(result, options.answer_tokens if options else 0)]
        if result.chunks > 1:
            notes.append(f"[summarised in {result.chunks} chunks, then combined]")
        return "\n".join(n for n in notes if n)

    def handoff(self, result: Summary) -> str:
        return result.text


TASK = SummarizeTask(
    name="summarize",
    summary="Summarise a text (a file, an argument, stdin, or a transcript from a chain).",
    takes="a text: a file (read whole), an argument or stdin",
    returns="a summary, with the finish reason and how many chunks a long input needed",
    Options=Options,
    Result=Result,
    Metrics=Metrics,
    input_kinds=("text",),
    model_kinds="a text-generation (causal LM) model such as smollm2-135m",
    produces="text",
    text_file="whole",
)
