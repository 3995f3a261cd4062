"""`run generate|embed|transcribe … --endpoint URL --model NAME [--api-key-env VAR]`: the job runs
on any OpenAI-compatible server (a URL ending in /v1) or Ollama's native API (any other URL), or the
kind given with --endpoint-kind (transcribe: OpenAI-compatible only, Ollama has no such API). The reply becomes the task's own record (runner/endpoints.py), printed,
written and logged as a local run's: streamed text as it comes, the metrics table, one run-log row.

The key is read only from the environment variable named by --api-key-env: never from argv (so
never in `ps`), never in a message, the run log or --json.
"""

from __future__ import annotations

import dataclasses

import click

from taskrun.tasks.base import Input, Task, TaskError

# generate's options an endpoint request does not carry: set to anything but their default, they
# are refused (an option is never silently dropped)
NOT_SENT = ("top_p", "top_k", "repeat_penalty", "raw", "json_schema", "draft", "draft_tokens")
# transcribe's: what /audio/transcriptions has no field for. The subtitle shaping (--max-line-width,
# --max-cue-s, ...) is done here, on the answer's times, so it is not among them.
TRANSCRIBE_NOT_SENT = (
    "chunk_s",
    "vad",
    "beam_size",
    "batch_size",
    "allow_partial",
    "speakers",
    "num_speakers",
    "min_speakers",
    "max_speakers",
)
NOT_HERE = {"runtime": None, "device": "auto", "dtype": "auto", "server": None, "offline": False}


def endpoint_params(task: str = "generate") -> list[click.Parameter]:
    """--endpoint, --endpoint-kind, --api-key-env (generate, embed, transcribe; `run chat` has its
    own); transcribe adds the request's --prompt and --temperature, which a local Whisper lacks."""
    return [
        click.Option(
            ["--endpoint"],
            metavar="URL",
            help="Run on an OpenAI-compatible server (URL ending in /v1) or Ollama's API "
            "(e.g. http://127.0.0.1:11434); --model names the endpoint's model.",
        ),
        click.Option(
            ["--endpoint-kind"],
            type=click.Choice(["openai", "ollama"]),
            help="The endpoint's API, where its URL does not say (default: /v1 → openai, else ollama).",
        ),
        click.Option(
            ["--api-key-env"],
            metavar="VAR",
            help="Name of the environment variable holding the endpoint's key (never the key itself).",
        ),
    ] + (_transcribe_params() if task == "transcribe" else [])


def _transcribe_params() -> list[click.Parameter]:
    return [
        click.Option(
            ["--prompt", "endpoint_prompt"],
            metavar="TEXT",
            help="With --endpoint: the request's prompt (names, spellings, the previous text).",
        ),
        click.Option(
            ["--temperature", "endpoint_temperature"],
            type=float,
            help="With --endpoint: the request's sampling temperature (the server's default when not given).",
        ),
    ]


def refuse_endpoint_only(endpoint: dict) -> None:
    """--prompt/--temperature without --endpoint: a local Whisper takes neither; never dropped."""
    given = [k for k in ("endpoint_prompt", "endpoint_temperature") if endpoint.get(k) is not None]
    if given and not endpoint.get("endpoint"):
        flags = ", ".join("--" + k.split("_", 1)[1] for k in given)
        raise TaskError(f"{flags}: only with --endpoint (a local transcribe takes no {flags}); drop them")


def make_endpoint(url: str, model: str | None, kind: str | None, api_key_env: str | None):
    from taskrun.pipelines.llm.endpoint_client import Endpoint

    return Endpoint.from_url(url, model or "", kind or "", api_key_env or "")


def execute_endpoint(
    task: Task,
    *,
    inputs,
    values,
    common: dict,
    extras: dict,
    endpoint: str,
    endpoint_kind,
    api_key_env,
    endpoint_prompt=None,
    endpoint_temperature=None,
) -> None:
    """A generate, embed or transcribe command's job(s) on ``endpoint``, printed and written as
    `execute` does."""
    from taskrun.runner.inputs import gather_inputs, options_from
    from taskrun.runner.output.writer import pick_format
    from taskrun.runner.runlog.store import RunLog

    given = [k for k, v in NOT_HERE.items() if common.get(k) != v] + (["then"] if extras.get("then") else [])
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise TaskError(f"{flags}: not with --endpoint (the endpoint runs its own model); drop them")
    ep = make_endpoint(endpoint, common["model"], endpoint_kind, api_key_env)
    if task.name == "transcribe":
        from taskrun.pipelines.speech.endpoint_client import check_transcribe_endpoint

        check_transcribe_endpoint(ep)
    fmt = pick_format(task, common["fmt"], common["output"])
    json_mode = common["json_mode"] or fmt == "json"
    options = options_from(task, values, fmt)
    _refuse_unsent(task, options)
    if common["output"]:
        from taskrun.runner.output.paths import check_output_path, job_paths

        check_output_path(common["output"], job_paths(task, inputs, common["files"], values))
    items = gather_inputs(task, inputs, common["files"])
    log = RunLog(common["log_db"])
    if task.name == "transcribe":
        from taskrun.runner.endpoints import transcribe_job

        rec = transcribe_job(ep, items, options, log=log, prompt=endpoint_prompt, temperature=endpoint_temperature)
        _finish(task, rec, _printer(task, options, fmt, common, json_mode), fmt, common, json_mode)
        return
    if task.name == "embed":
        from taskrun.runner.endpoints import embed_job

        rec = embed_job(ep, items, options, log=log)
        _finish(task, rec, _printer(task, options, fmt, common, json_mode), fmt, common, json_mode)
        return
    for item in items:
        _generate_one(task, ep, item, options, log, fmt, common, json_mode)


def _refuse_unsent(task: Task, options) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(task.Options)}
    names = TRANSCRIBE_NOT_SENT if task.name == "transcribe" else NOT_SENT
    unsent = [k for k in names if k in defaults and getattr(options, k) != defaults[k]]
    if not unsent:
        return
    flags = ", ".join("--" + k.replace("_", "-") for k in unsent)
    if task.name == "transcribe":
        sent = "--language, --task, --word-timestamps, --prompt, --temperature"
        raise TaskError(f"{flags}: not sent to a transcription endpoint (only {sent} are); drop them")
    raise TaskError(f"{flags}: not sent to an endpoint (only max-tokens, temperature, seed, stop are); drop them")


def messages_of(options, prompt: str) -> list[dict]:
    """generate's system, history and prompt as chat messages."""
    out = [{"role": "system", "content": options.system}] if options.system else []
    out += [{"role": role, "content": text} for role, text in options.history]
    return out + [{"role": "user", "content": prompt}]


def _generate_one(task, ep, item: Input, options, log, fmt, common, json_mode) -> None:
    from taskrun.runner.endpoints import generate_job
    from taskrun.tasks import events as ev

    printer = _printer(task, options, fmt, common, json_mode)
    prompt = item.text or ""
    rec, _ = generate_job(
        ep,
        messages_of(options, prompt),
        options,
        prompt=prompt,
        log=log,
        source=item.source,
        on_text=lambda t: printer(ev.Token(t, 0)),
    )
    g = rec.results[0]
    if options.price_in or options.price_out:
        g.cost = (g.input_tokens * options.price_in + g.output_tokens * options.price_out) / 1e6
        rec.metrics.cost = g.cost
    _finish(task, rec, printer, fmt, common, json_mode)


def _printer(task, options, fmt, common, json_mode):
    from taskrun.runner.output.writer import EventPrinter

    # as a local first stage: the items of a file format (npy, srt) are not printed, the file is the result
    return EventPrinter(
        task,
        options,
        json_mode=json_mode,
        quiet=common["quiet"],
        stream=getattr(options, "stream", True),
        show_items=fmt in (None, "text") or json_mode,
    )


def _finish(task, rec, printer, fmt, common, json_mode) -> None:
    from taskrun.runner.output.writer import emit
    from taskrun.tasks import events as ev

    for it in rec.items:
        for seg in getattr(it.result, "segments", ()):  # a transcript shows as a local run's: segment by segment
            printer(ev.Partial(seg, it.index))
        printer(it)
    printer(ev.Done(rec.metrics))
    emit(task, rec, fmt, common["output"], json_mode, common["quiet"])
