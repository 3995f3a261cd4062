"""One attempt of one case on one setup → an :class:`Attempt`, logged as one run-log row of the
eval's chain id (``run logs --chain ID``). A local setup runs as any generate job (run_job: the
same checks, model cache, metrics and row); an endpoint setup goes through the endpoint client and
its row is built here from the reply, with the endpoint's URL (no credentials), the model name it
reported and its digest where it gives one.

Times are the setup's, with the model's load left out: ``ttft_s`` from the request to the first
text (at this client for an endpoint; in the job for a local model), ``completion_s`` to the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taskrun.runner.eval.cases import Case, check
from taskrun.runner.eval.setups import Setup
from taskrun.tasks.base import Input, TaskError


@dataclass
class Attempt:
    case: str
    setup: str
    n: int  # 1 = first try
    accepted: bool = False
    finish_reason: str = ""
    why: str = ""  # why not accepted
    error: str = ""  # the request failed (no answer)
    ttft_s: float | None = None
    completion_s: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    retries: int = 0
    cost: float = 0.0
    text: str = field(default="", repr=False)
    row_id: str = ""
    ran: str = ""  # what answered: runtime, device, dtype, digest and the engine's own notes (kernels), or the endpoint

    @property
    def incomplete(self) -> bool:
        return self.finish_reason == "length"


def split_messages(messages: list[dict]) -> tuple[str, tuple, str]:
    """(system, history pairs, last user prompt) as generate's Options take them."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    if not turns or turns[-1]["role"] != "user":
        raise TaskError("a case's messages must end with a user message")
    return system, tuple((m["role"], m["content"]) for m in turns[:-1]), turns[-1]["content"]


def run_attempt(case: Case, setup: Setup, n: int, *, eval_id: str, seed: int | None, log, judge=None) -> Attempt:
    a = Attempt(case.id, setup.name, n)
    try:
        if setup.endpoint:
            _endpoint(case, setup, a, eval_id, seed, log)
        else:
            _local(case, setup, a, eval_id, seed, log)
    except TaskError as exc:
        a.error = str(exc)
        return a
    a.cost = setup.cost(a.input_tokens, a.output_tokens, a.completion_s)
    if a.incomplete:
        a.why = "incomplete (length)"
    else:
        a.accepted, a.why = check(case, a.text, judge)
    return a


def _options(setup: Setup, case: Case, seed: int | None):
    from taskrun.runner.inputs import options_from
    from taskrun.tasks import get_task

    system, history, _ = split_messages(case.messages)
    values = {"temperature": 0.0, **setup.options, "system": system, "history": history, "stream": False}
    if seed is not None:
        values["seed"] = seed
    return options_from(get_task("generate"), values)


def _local(case: Case, setup: Setup, a: Attempt, eval_id: str, seed, log) -> None:
    from taskrun.runner.jobs import run_job
    from taskrun.tasks import get_task

    prompt = split_messages(case.messages)[2]
    rec = run_job(
        get_task("generate"),
        lambda: [Input(source=f"case {case.id}", kind="text", text=prompt)],
        _options(setup, case, seed),
        model=setup.model,
        runtime=setup.runtime,
        log=log,
        chain_id=eval_id,
        stage=a.n,
    )
    g, m = rec.items[0].result, rec.metrics
    a.row_id, a.text, a.finish_reason = rec.id, g.text, g.finish_reason
    a.input_tokens, a.output_tokens = g.input_tokens, g.output_tokens
    a.ttft_s = max(0.0, m.ttft_s - rec.load_s) if m.ttft_s is not None else None
    a.completion_s = max(0.0, rec.wall_s - rec.load_s)
    a.ran = ran(rec)


def ran(rec) -> str:
    """What answered, as a line: a setup's answers depend on it (llama.cpp's kernel levels word
    greedy answers differently at near ties: docs/language-models.md)."""
    card = rec.card  # (bench's ran_notes reads the same notes, but a door does not import another door)
    digest = (card.digest or "")[:19] if card else ""
    head = ", ".join(x for x in (rec.runtime, rec.device, rec.dtype, digest) if x)
    return "; ".join([head, *(card.extra.get("ran", ()) if card else ())])


def _endpoint(case: Case, setup: Setup, a: Attempt, eval_id: str, seed, log) -> None:
    from taskrun.pipelines.llm.endpoint_client import Endpoint
    from taskrun.runner.endpoints import generate_job

    ep = Endpoint.from_spec(setup.endpoint, setup.api_key_env)
    rec, reply = generate_job(
        ep,
        case.messages,
        _options(setup, case, seed),
        prompt=case.prompt,
        log=log,
        source=f"case {case.id}",
        chain_id=eval_id,
        stage=a.n,
    )
    g = rec.items[0].result
    a.row_id, a.text, a.finish_reason, a.retries = rec.id, reply.text, g.finish_reason, reply.retries
    a.ran = f"{rec.runtime} {rec.card.path}, model {rec.card.name}"  # the URL without credentials
    a.input_tokens, a.output_tokens, a.ttft_s, a.completion_s = (
        g.input_tokens,
        g.output_tokens,
        reply.ttft_s,
        reply.total_s,
    )
