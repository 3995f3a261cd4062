"""generate on any LLM engine: each prompt decoded by the shared streaming loop
(pipelines/llm/decode.py); --json-schema answers are held to a grammar (pipelines/llm/grammar.py)
and checked by pipelines/llm/schema.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from taskrun.pipelines.llm.decode import Decoded
from taskrun.pipelines.llm.engine import LLMEngine
from taskrun.pipelines.llm.pipeline import LLMPipeline, per_input
from taskrun.pipelines.llm.sampling import Sampling
from taskrun.pipelines.llm.schema import schema_system, validate
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.generate import Generation, Metrics, load_schema, schema_grammar


class GeneratePipeline(LLMPipeline):
    task = "generate"

    def run(self, inputs, options, clock):
        schema = load_schema(options.json_schema) if options.json_schema else None
        seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
        s = Sampling(
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k,
            seed=seed,
            stop=tuple(options.stop),
            repeat_penalty=options.repeat_penalty,
            grammar=schema_grammar(schema) if schema is not None else "",
            draft=self._draft(options.draft, schema is not None),
            draft_tokens=options.draft_tokens,
        )
        system = schema_system(schema, options.system)
        totals = _Totals()

        window = self._window(options)
        if options.context > window:
            yield ev.Notice(
                f"a context of {options.context} tokens was asked for; {self.card.name} reads at most "
                f"{window}, so this job's window is {window}"
            )

        def one(i, inp):
            ids, dropped = self._prompt(inp.text, options, system, "")
            out = Decoded()
            room = window - len(ids)  # a window smaller than the model's (--context, num_ctx) caps the answer
            si = s if room >= s.max_tokens else replace(s, max_tokens=room)
            text = yield from self._answer(ids, si, clock, out, i, options.stream)
            if si is not s and out.finish_reason == "length" and len(out.token_ids) >= room:
                out.hit_window = True
            totals.add(len(ids), out)
            n_out = len(out.token_ids)
            res = Generation(
                prompt=inp.text,
                text=text,
                finish_reason=out.finish_reason,
                input_tokens=len(ids),
                output_tokens=n_out,
                seed=seed,
                truncated_tokens=dropped,
                cost=estimate_cost(len(ids), n_out, options.price_in, options.price_out),
            )
            if schema is not None:
                validate(res, schema, options.max_tokens)
            return res

        yield from per_input(inputs, one)
        yield from self.engine_notes()
        yield from self.draft_notes(totals.draft_stopped, len(totals.reasons))
        yield ev.Done(totals.metrics(options))

    def _draft(self, asked: str, grammar: bool):
        """The draft engine for speculative decoding (--draft, or the model's default), or None."""
        from taskrun.pipelines.llm.speculative import draft_name, load_draft

        return load_draft(draft_name(self.card, asked), self.engine, bool(asked), grammar)

    def _answer(self, ids, s, clock, out, index, stream):
        """Decode one answer, its pieces as Token events when streaming; returns its text."""
        for piece in self.engine.stream(ids, s, clock, out):
            if stream:
                yield ev.Token(piece, index)
        return out.text

    def _window(self, options) -> int:
        """The job's window: the model's, or the smaller one asked for (--context, Ollama's num_ctx)."""
        own, asked = self.engine.context, getattr(options, "context", 0)
        if asked < 0:
            raise TaskError(f"--context {asked} is no window: give a number of tokens, or 0 for the model's ({own})")
        return min(own, asked) if asked else own

    def _prompt(self, text, options, system, prefix):
        """The prompt's token ids, refused (or cut with --truncate) when it leaves no room to answer.
        A text longer than the window is never tokenised whole: only a head of it that surely
        fills the window (``text_head``), so a 1 MB file costs what a window's worth does."""
        llm = self.engine
        window = self._window(options)
        head = text_head(llm, text, window)
        ids = llm.prompt_ids(head, system, options.raw, prefix, options.history)
        if head is text and len(ids) < window:
            return ids, 0
        if not options.truncate:
            size = f"{len(ids)} tokens" if head is text else f"over {window} tokens ({len(text):,} characters)"
            raise TaskError(
                f"the prompt is {size}; {self.card.name} reads at most {window} "
                f"(prompt + answer). Shorten it, or pass --truncate to cut its end"
            )
        room = max(1, min(options.max_tokens, window // 4))  # leave the answer some room
        ids, dropped = fit_prompt(llm, head, window - room, system, options.raw, prefix, options.history)
        return ids, dropped + count_tokens(llm, text[len(head) :])


@dataclass
class _Totals:
    """The job's sums over its answers, for its metrics."""

    input_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    draft_stopped: int = 0  # answers whose draft stopped, slower than the model alone
    ttft_s: float | None = None  # the first answer's first token, on the job's clock
    reasons: list[str] = field(default_factory=list)

    def add(self, input_tokens: int, out: Decoded) -> None:
        if self.ttft_s is None and out.first_token_at is not None:
            self.ttft_s = out.first_token_at
        self.input_tokens += input_tokens
        self.cached_prompt_tokens += out.cached_prompt_tokens
        self.output_tokens += len(out.token_ids)
        self.prefill_s += out.prefill_s
        self.decode_steps += out.decode_steps
        self.decode_s += out.decode_s
        self.draft_tokens += out.draft_tokens
        self.accepted_draft_tokens += out.accepted_draft_tokens
        self.draft_stopped += out.draft_stopped_at > 0
        self.reasons.append(out.finish_reason)

    def metrics(self, options) -> Metrics:
        return Metrics(
            input_tokens=self.input_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            output_tokens=self.output_tokens,
            ttft_s=self.ttft_s or 0.0,
            prefill_s=self.prefill_s,
            decode_tokens_per_s=self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0,
            draft_tokens=self.draft_tokens,
            accepted_draft_tokens=self.accepted_draft_tokens,
            draft_acceptance=self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0,
            draft_stopped=self.draft_stopped,
            finish_reason=",".join(dict.fromkeys(self.reasons)),
            cost=estimate_cost(self.input_tokens, self.output_tokens, options.price_in, options.price_out),
        )


HEAD_CHARS_PER_TOKEN = 8  # a first guess at a head's length: about twice English's characters per token
COUNT_CHARS = 1 << 16  # the rest of a cut text is counted in pieces this long (memory stays flat)


def text_head(llm: LLMEngine, text: str, tokens: int) -> str:
    """``text`` itself, or a prefix of it that takes at least ``tokens`` tokens: tried at
    ``tokens`` × 8 characters and doubled until it does, so no more than about twice what the
    window needs is ever tokenised however long the text is."""
    n = tokens * HEAD_CHARS_PER_TOKEN
    while n < len(text):
        head = text[:n]
        if llm.count(head) >= tokens:
            return head
        n *= 2
    return text


def count_tokens(llm: LLMEngine, text: str) -> int:
    """About how many tokens ``text`` takes (exact to a token per 64 K characters), counted a
    piece at a time so that a long text never lives in memory as tokens all at once."""
    return sum(llm.count(text[i : i + COUNT_CHARS]) for i in range(0, len(text), COUNT_CHARS))


def fit_prompt(
    llm: LLMEngine, text: str, budget: int, system: str = "", raw: bool = False, prefix: str = "", history: tuple = ()
) -> tuple[list[int], int]:
    """(ids, dropped): the prompt with the end of ``text`` cut so that it takes at most
    ``budget`` tokens; ``dropped`` counts the text tokens removed."""
    ids = llm.prompt_ids(text, system, raw, prefix, history)
    if len(ids) <= budget:
        return ids, 0
    body = llm.encode(text)
    overhead = len(ids) - len(body)
    keep = budget - overhead
    if keep <= 0:
        raise TaskError(
            f"the template and system prompt alone take {overhead} tokens, more than "
            f"the {budget} available; shorten --system or lower --max-tokens"
        )
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
