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
from datetime import datetime, timezone

from taskrun.runner.eval.cases import Case, check
from taskrun.runner.eval.setups import Setup
from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, ModelCard, TaskError


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


def _endpoint(case: Case, setup: Setup, a: Attempt, eval_id: str, seed, log) -> None:
    from taskrun.pipelines.llm.endpoint_client import Endpoint, safe_url
    from taskrun.runner.jobs import JobRecord, new_id
    from taskrun.runner.runlog.rows import log_row
    from taskrun.tasks.generate import Generation

    ep = Endpoint.from_spec(setup.endpoint, setup.api_key_env)
    options = _options(setup, case, seed)
    rec = JobRecord(
        id=new_id(),
        task="generate",
        started_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        options=options,
        runtime=f"endpoint:{ep.api}",
        device="remote",
        dtype="remote",
        chain_id=eval_id,
        stage=a.n,
        n_inputs=1,
    )
    try:
        reply = ep.chat(
            case.messages, max_tokens=options.max_tokens, temperature=options.temperature, seed=seed, stop=options.stop
        )
    except TaskError as exc:
        rec.status, rec.error = "failed", str(exc)
        rec.card = _card(ep, "", "")
        if log is not None:
            log.append(log_row(rec))
        raise
    rec.card = _card(ep, reply.model, reply.digest)
    g = Generation(
        prompt=case.prompt,
        text=reply.text,
        finish_reason=reply.finish_reason or "stop",
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
        seed=seed or 0,
    )
    rec.items.append(ev.Item(0, f"case {case.id}", g))
    rec.metrics = _metrics(reply, g)
    rec.wall_s, rec.status = reply.total_s, "ok"
    rec.notes.append(
        f"endpoint {safe_url(ep.url)}; ttft_s at this client; server reported {reply.server or 'nothing'}; retries {reply.retries}"
    )
    rec.texts = [(0, "input", case.prompt), (0, "output", reply.text)]
    if log is not None:
        log.append(log_row(rec))
    a.row_id, a.text, a.finish_reason, a.retries = rec.id, reply.text, g.finish_reason, reply.retries
    a.input_tokens, a.output_tokens, a.ttft_s, a.completion_s = (
        g.input_tokens,
        g.output_tokens,
        reply.ttft_s,
        reply.total_s,
    )


def _metrics(reply, g):
    """The row's metrics from an endpoint's reply: TTFT at this client, decode rate after it."""
    from taskrun.tasks.generate import Metrics

    tail = reply.total_s - (reply.ttft_s or 0)
    return Metrics(
        input_tokens=g.input_tokens,
        output_tokens=g.output_tokens,
        ttft_s=reply.ttft_s or 0.0,
        prefill_s=float(reply.server.get("prompt_eval_s", 0.0)),
        decode_tokens_per_s=(g.output_tokens - 1) / tail if tail > 0 and g.output_tokens > 1 else 0.0,
        finish_reason=g.finish_reason,
    )


def _card(ep, reported: str, digest: str) -> ModelCard:
    from taskrun.pipelines.llm.endpoint_client import safe_url

    return ModelCard(
        name=reported or ep.model,
        path=safe_url(ep.url),
        architecture="endpoint",
        tasks=("generate",),
        runtime=f"endpoint:{ep.api}",
        runtimes=(f"endpoint:{ep.api}",),
        size_bytes=0,
        digest=digest,
        source=f"endpoint {ep.api} {safe_url(ep.url)} (asked for {ep.model})",
        kind="text-generation",
    )
