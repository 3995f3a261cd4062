"""summarize on any LLM engine: one pass when the text fits the window, else map-reduce.

Map: the text is split at paragraph, then sentence, then word boundaries into chunks that fit
with room for the answer; each chunk is summarised. Reduce: the partial summaries are joined and
summarised again (repeatedly, if even they do not fit). Only the final pass streams.
"""

from __future__ import annotations

import re

from taskrun.pipelines.llm.decode import Decoded, complete
from taskrun.pipelines.llm.pipeline import LLMPipeline, per_input
from taskrun.pipelines.llm.sampling import Sampling
from taskrun.tasks import events as ev
from taskrun.tasks.base import TaskError
from taskrun.tasks.summarize import LENGTHS, Metrics, Summary

# After the text, where a small model heeds it most. Measured on samples/council-note.txt with the
# 1.5B default at temperature 0 (`run summarize samples/council-note.txt`): "Keep names, numbers
# and decisions." before the text gave a medium summary without who voted against or the works'
# start; this one has both, still not the 3-1 count or the meeting's date at medium, and it merged
# two items once ("open Saturdays ... in September"); --length long keeps every fact
# (tests/test_default_llm_quality.py).
KEEP = "Keep every name, number, date and decision, with each vote's count and who voted against; add nothing."
INSTRUCTION = "Summarize the following text {how}.\n\n{text}\n\n" + KEEP
PART = "Summarize this part of a longer text in a few sentences.\n\n{text}\n\n" + KEEP
COMBINE = "These are summaries of consecutive parts of one text. Combine them into one summary {how}.\n\n{text}"
MAX_ROUNDS = 6
SPEAKERS = re.compile(r"^SPEAKER_\d+: ", re.M)
# Measured on samples/meeting.wav's transcript with the 1.5B default at temperature 0 (`run chain
# meeting-notes samples/meeting.wav`, --length long, one speaker's consecutive lines merged):
# "list the decisions and actions by speaker" and "summarise ... point by point" both kept only
# the first of SPEAKER_1's five sentences (Dashwood's leisure) and dropped the other four; "sentence
# by sentence ... as said; do not interpret it" keeps all 18 facts (2 runs of 2). At medium the same
# words drop "John", "cold-hearted and selfish" and, once, read "go forward" as "the meeting moves
# forward": the chain asks for long. tests/test_default_llm_quality.py holds it to every fact.
BY_SPEAKER = (
    " It is a meeting transcript with speaker labels: for each speaker (SPEAKER_k), say what they said,"
    " sentence by sentence, with every full name, number, object and action as said; do not interpret it."
)


def by_speaker(template: str, text: str) -> str:
    """A speaker-labelled transcript (transcribe --speakers) asks for decisions and actions by
    speaker: the instruction's first line gains that request."""
    if not SPEAKERS.search(text):
        return template
    head, sep, rest = template.partition("\n\n")
    return head + BY_SPEAKER + sep + rest


def merge_turns(text: str) -> str:
    """One line per turn: a speaker's consecutive lines joined after one label. Line by line, the
    model copied the first of SPEAKER_1's five lines and dropped the rest; as one turn it kept all."""
    if not SPEAKERS.search(text):
        return text
    lines: list[list[str]] = []
    for line in text.splitlines():
        label, sep, said = line.partition(": ")
        if sep and SPEAKERS.match(line) and lines and lines[-1][0] == label:
            lines[-1].append(said.strip())
        elif sep and SPEAKERS.match(line):
            lines.append([label, said.strip()])
        else:
            lines.append(["", line])
    return "\n".join(f"{t[0]}: {' '.join(t[1:])}" if t[0] else t[1] for t in lines)


class SummarizePipeline(LLMPipeline):
    task = "summarize"

    def run(self, inputs, options, clock):
        budget = self._budget(options)
        s = Sampling(
            max_tokens=options.answer_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            seed=options.seed,
            repeat_penalty=options.repeat_penalty,
            draft=self._draft(options.draft),
            draft_tokens=options.draft_tokens,
        )
        stages: list[dict] = []
        done: list[tuple[Summary, Decoded]] = []

        def one(i, inp):
            res, final = yield from self._one(i, inp.text, options, s, budget, clock, stages)
            done.append((res, final))
            return res

        yield from per_input(inputs, one)
        last = done[0][1] if done else None  # the first summary's final pass: what a user waits for
        n_dec = sum(st["decode_steps"] for st in stages)
        t_dec = sum(st["decode_s"] for st in stages)
        yield from self.engine_notes()
        yield from self.draft_notes(sum(st["draft_stopped_at"] > 0 for st in stages), len(stages))
        drafted, accepted = sum(st["draft_tokens"] for st in stages), sum(st["accepted_draft_tokens"] for st in stages)
        yield ev.Done(
            Metrics(
                input_tokens=sum(st["input_tokens"] for st in stages),
                cached_prompt_tokens=sum(st["cached_prompt_tokens"] for st in stages),
                output_tokens=sum(st["output_tokens"] for st in stages),
                ttft_s=(last.first_token_at or 0.0) if last else 0.0,
                prefill_s=sum(st["prefill_s"] for st in stages),
                decode_tokens_per_s=n_dec / t_dec if t_dec > 0 else 0.0,
                draft_tokens=drafted,
                accepted_draft_tokens=accepted,
                draft_acceptance=accepted / drafted if drafted else 0.0,
                draft_stopped=sum(st["draft_stopped_at"] > 0 for st in stages),
                finish_reason=last.finish_reason if last else "",
                chunks=sum(res.chunks for res, _ in done),
                stages=stages,
            )
        )

    def _draft(self, asked: str):
        """The draft engine for speculative decoding (--draft, or the model's default), or None."""
        from taskrun.pipelines.llm.speculative import draft_name, load_draft

        return load_draft(draft_name(self.card, asked), self.engine, bool(asked))

    def _budget(self, options) -> int:
        """Text tokens one pass can read: the window less the answer and the instruction. Too few
        is a problem of the options, for every input alike."""
        llm = self.engine
        window = min(llm.context, options.context or llm.context)
        answer = options.answer_tokens
        how = LENGTHS[options.length][1]
        overhead = len(llm.prompt_ids(INSTRUCTION.format(how=how, text=""))) + 8
        budget = window - answer - overhead
        if budget < 32:
            raise TaskError(
                f"a {answer}-token summary leaves no room in a {window}-token window; "
                f"lower --max-tokens or raise --context"
            )
        return budget

    def _one(self, index, text, options, s, budget, clock, stages):
        """Summarise one text; yields the final pass's tokens, returns (Summary, its Decoded)."""
        llm = self.engine
        source_tokens = llm.count(text)
        text = merge_turns(text)
        text, chunks, rounds = yield from self._map(text, budget, s, clock, stages)
        template = COMBINE if chunks > 1 else INSTRUCTION
        ids = llm.prompt_ids(by_speaker(template, text).format(how=LENGTHS[options.length][1], text=text))
        out = Decoded()
        for piece in llm.stream(ids, s, clock, out):
            if options.stream:
                yield ev.Token(piece, index)
        stages.append(_stage("final", 0, len(ids), out))
        res = Summary(
            text=out.text.strip(),
            finish_reason=out.finish_reason,
            input_tokens=source_tokens,
            output_tokens=len(out.token_ids),
            chunks=chunks,
            stages=rounds + 1,
        )
        return res, out

    def _map(self, text, budget, s, clock, stages):
        """Summarise the text's parts, then those summaries, until it fits ``budget``; yields
        progress, returns (text, chunks in the first round, rounds)."""
        llm = self.engine
        chunks = 1
        round_ = 0
        while llm.count(text) > budget:
            round_ += 1
            if round_ > MAX_ROUNDS:
                raise TaskError(
                    f"the partial summaries still do not fit after {MAX_ROUNDS} rounds; "
                    f"use a shorter --length or a model with a larger window"
                )
            pieces = split_to_fit(text, budget, llm.count)
            if round_ == 1:
                chunks = len(pieces)
            parts = []
            for j, piece in enumerate(pieces):
                yield ev.Progress(j, len(pieces), "chunks", f"map round {round_}")
                ids = llm.prompt_ids(PART.format(text=piece))
                out = complete(llm, ids, s, clock)
                stages.append(_stage(f"map{round_}", j, len(ids), out))
                parts.append(out.text.strip())
            yield ev.Progress(len(pieces), len(pieces), "chunks", f"map round {round_}")
            text = "\n\n".join(parts)  # unlabelled: a small model copies "Part 1:" labels into its answer
        return text, chunks, round_


def _stage(kind: str, chunk: int, input_tokens: int, out: Decoded) -> dict:
    return {
        "stage": kind,
        "chunk": chunk,
        "input_tokens": input_tokens,
        "output_tokens": len(out.token_ids),
        "cached_prompt_tokens": out.cached_prompt_tokens,
        "prefill_s": round(out.prefill_s, 4),
        "decode_s": round(out.decode_s, 4),
        "decode_steps": out.decode_steps,
        "draft_tokens": out.draft_tokens,
        "accepted_draft_tokens": out.accepted_draft_tokens,
        "draft_stopped_at": out.draft_stopped_at,
        "finish_reason": out.finish_reason,
    }


def split_to_fit(text: str, budget: int, count) -> list[str]:
    """Consecutive pieces of ``text`` of at most ``budget`` tokens each, cut at the largest unit
    that fits: paragraphs, then sentences, then words."""
    units = _units(text, budget, count)
    pieces, cur, cur_n = [], [], 0
    for u, n in units:
        if cur and cur_n + n > budget:
            pieces.append(" ".join(cur))
            cur, cur_n = [], 0
        cur.append(u)
        cur_n += n
    if cur:
        pieces.append(" ".join(cur))
    return pieces


def _units(text: str, budget: int, count) -> list[tuple[str, int]]:
    out = []
    for para in (p.strip() for p in re.split(r"\n\s*\n", text)):
        if not para:
            continue
        n = count(para)
        if n <= budget:
            out.append((para, n))
            continue
        for sent in re.split(r"(?<=[.!?])\s+", para):
            n = count(sent)
            if n <= budget:
                out.append((sent, n))
                continue
            words = sent.split()
            step = max(1, len(words) * budget // (2 * n))  # about half a budget of words at a time
            for k in range(0, len(words), step):
                w = " ".join(words[k : k + step])
                out.append((w, count(w)))
    return out
