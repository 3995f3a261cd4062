"""Jobs run on an endpoint (OpenAI-compatible or Ollama's native API) as on any runtime: the
endpoint client (pipelines/llm/endpoint_client.py) answers, and this module turns its reply into
the task's own :class:`JobRecord` (results, metrics, run-log row), so `run generate --endpoint`,
`run chat --endpoint`, `run embed --endpoint`, `run transcribe --endpoint` and `run eval`'s endpoint
setups share one path
(the doors import this shared module, never each other).

Scopes: ``ttft_s`` and ``wall_s`` are measured at this client; what the server reported (Ollama's
``eval_duration``, ``prompt_eval_duration``, ``load_duration``; OpenAI's ``usage``) is kept apart in
the row's notes. The row holds the endpoint's URL without credentials, the model name it reported
and its digest where its listing gives one; the key is never in it.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, ModelCard, TaskError

KINDS = {"generate": "text-generation", "embed": "sentence-embedding", "transcribe": "speech-recognition"}


def _record(task: str, options, ep, *, chain_id=None, stage=None, n_inputs: int = 1):
    from taskrun.runner.jobs import JobRecord, new_id

    return JobRecord(
        id=new_id(),
        task=task,
        started_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        options=options,
        runtime=f"endpoint:{ep.api}",
        device="remote",
        dtype="remote",
        chain_id=chain_id,
        stage=stage,
        n_inputs=n_inputs,
        card=card(ep, "", "", task),
    )


def _failed(rec, exc: TaskError, log) -> None:
    rec.status, rec.error = "failed", str(exc)
    if log is not None:
        from taskrun.runner.runlog.rows import log_row

        log.append(log_row(rec))


def _note(ep, reply) -> str:
    from taskrun.pipelines.llm.endpoint_client import safe_url

    return (
        f"endpoint {safe_url(ep.url)}; ttft_s and wall_s at this client; "
        f"server reported {reply.server or 'nothing'}; retries {reply.retries}"
    )


def generate_job(
    ep, messages: list[dict], options, *, prompt: str, log, source="prompt", chain_id=None, stage=None, on_text=None
):
    """One generate job on ``ep`` → (JobRecord, Reply); the row is appended to ``log``. A failed
    request is logged as a failed row, then raised (its message names the endpoint)."""
    from taskrun.runner.runlog.rows import log_row
    from taskrun.tasks.generate import Generation

    rec = _record("generate", options, ep, chain_id=chain_id, stage=stage)
    seed = getattr(options, "seed", None)
    try:
        reply = ep.chat(
            messages,
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            seed=seed,
            stop=tuple(options.stop or ()),
            on_text=on_text,
        )
    except TaskError as exc:
        _failed(rec, exc, log)
        raise
    rec.card = card(ep, reply.model, reply.digest, "generate")
    g = Generation(
        prompt=prompt,
        text=reply.text,
        finish_reason=reply.finish_reason or "stop",
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
        seed=seed or 0,
    )
    rec.items.append(ev.Item(0, source, g))
    rec.metrics = generate_metrics(reply, g)
    rec.wall_s, rec.status = reply.total_s, "ok"
    rec.notes.append(_note(ep, reply))
    rec.texts = [(0, "input", prompt), (0, "output", reply.text)]
    if log is not None:
        log.append(log_row(rec))
    return rec, reply


def generate_metrics(reply, g):
    """generate's Metrics from an endpoint's reply: TTFT at this client, decode rate after it;
    prefill only where the server reported it (Ollama's prompt_eval_duration)."""
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


def embed_job(ep, inputs: list[Input], options, *, log):
    """One embed job on ``ep``: every text in one request → JobRecord (vectors L2-normalised when
    ``--normalize``, as a local run's are)."""
    import numpy as np

    from taskrun.runner.runlog.rows import log_row
    from taskrun.tasks.embed import Embedding, Metrics

    rec = _record("embed", options, ep, n_inputs=len(inputs))
    texts = [i.text or "" for i in inputs]
    try:
        out = ep.embed(texts)
    except TaskError as exc:
        _failed(rec, exc, log)
        raise
    rec.card = card(ep, out.model, out.digest, "embed")
    for i, (text, vec) in enumerate(zip(texts, out.vectors, strict=True)):
        v = np.asarray(vec, dtype=np.float32)
        if getattr(options, "normalize", True):
            n = float(np.linalg.norm(v))
            v = v / n if n > 0 and math.isfinite(n) else v
        rec.items.append(ev.Item(i, inputs[i].source, Embedding(text=text, vector=v, tokens=0)))
    dim = len(out.vectors[0]) if out.vectors else 0
    rec.metrics = Metrics(
        items=len(texts),
        input_tokens=out.input_tokens,
        items_per_s=len(texts) / out.total_s if out.total_s > 0 else 0.0,
        dim=dim,
    )
    rec.wall_s, rec.status = out.total_s, "ok"
    rec.notes.append(_note(ep, out) + "; items_per_s over the request's round trip")
    if log is not None:
        log.append(log_row(rec))
    return rec


def transcribe_job(ep, inputs: list[Input], options, *, log, prompt=None, temperature=None):
    """One transcribe job on ``ep``: every file checked here (a header probe) before any is sent,
    then one request per file, in order → JobRecord. ``rtf`` is this client's: the requests' round
    trips ÷ the audio's length (the upload, the server's queue and decode are all inside it). A
    failed request is logged as a failed row, then raised (its message names the endpoint)."""
    import time

    from taskrun.pipelines.speech.endpoint_client import check_transcribe_endpoint
    from taskrun.runner.jobs import input_digest, peak_rss_mb
    from taskrun.runner.runlog.rows import job_texts, log_row
    from taskrun.tasks.audio_files import probe_input
    from taskrun.tasks.base import check_input_kind
    from taskrun.tasks.transcribe import TASK, Metrics

    t0 = time.perf_counter()
    check_transcribe_endpoint(ep)
    if not inputs:
        raise TaskError(f"no input given; transcribe takes {TASK.takes}")
    lengths = []
    for inp in inputs:  # a file that is not audio fails here, before any upload
        check_input_kind(TASK, inp)
        lengths.append(probe_input(inp).duration_s)
    rec = _record("transcribe", options, ep, n_inputs=len(inputs))
    rec.input_digest = input_digest(inputs)
    try:
        busy, retries, reported, digest = _transcribe_files(ep, inputs, lengths, options, rec, prompt, temperature)
    except TaskError as exc:
        _failed(rec, exc, log)
        raise
    audio = sum(tr.audio_s for tr in rec.results)
    words = sum(len(tr.text.split()) for tr in rec.results)
    rec.card = card(ep, reported, digest, "transcribe")
    rec.metrics = Metrics(audio_s=round(audio, 3), rtf=busy / audio if audio else 0.0, chunks=None, words=words)
    rec.wall_s, rec.status, rec.peak_rss_mb = time.perf_counter() - t0, "ok", peak_rss_mb()
    named = "as the endpoint reported it" if reported else "as asked for (the answer names none)"
    rec.notes.append(
        f"endpoint {_safe(ep.url)}; rtf at this client: request round trips (upload, server queue and "
        f"decode, answer) ÷ audio_s; chunks not reported by the endpoint; model {named}; retries {retries}"
    )
    rec.texts = job_texts(TASK, inputs, rec)
    if log is not None:
        log.append(log_row(rec))
    return rec


def _transcribe_files(ep, inputs, lengths, options, rec, prompt, temperature):
    """Each file's request → an Item in ``rec``; (seconds in requests, retries, model reported, digest)."""
    from taskrun.pipelines.speech.endpoint_client import transcribe
    from taskrun.tasks.transcribe import Transcript

    busy, retries, reported, digest = 0.0, 0, "", ""
    for i, (inp, length) in enumerate(zip(inputs, lengths, strict=True)):
        out = transcribe(
            ep,
            inp.path,
            language=options.language,
            translate=options.task == "translate",
            words=options.word_timestamps,
            prompt=prompt,
            temperature=temperature,
        )
        # the server's decoded length where it says (as a local run's), else the file header's
        audio_s = out.duration_s if out.duration_s is not None else length
        language = out.language or options.language or ""
        rec.items.append(ev.Item(i, inp.source, Transcript(inp.source, out.text, language, audio_s, out.segments)))
        busy, retries = busy + out.total_s, retries + out.retries
        reported, digest = out.model or reported, out.digest or digest
    return busy, retries, reported, digest


def _safe(url: str) -> str:
    from taskrun.pipelines.llm.endpoint_client import safe_url

    return safe_url(url)


def card(ep, reported: str, digest: str, task: str = "generate") -> ModelCard:
    """The row's model: the name the endpoint reported (else the one asked for), its URL without
    credentials as the path, its digest where given."""
    from taskrun.pipelines.llm.endpoint_client import safe_url

    return ModelCard(
        name=reported or ep.model,
        path=safe_url(ep.url),
        architecture="endpoint",
        tasks=(task,),
        runtime=f"endpoint:{ep.api}",
        runtimes=(f"endpoint:{ep.api}",),
        size_bytes=0,
        digest=digest,
        source=f"endpoint {ep.api} {safe_url(ep.url)} (asked for {ep.model})",
        kind=KINDS.get(task, ""),
    )
