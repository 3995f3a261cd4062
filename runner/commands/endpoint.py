"""`run generate|embed … --endpoint URL --model NAME [--api-key-env VAR]`: the job runs on any
OpenAI-compatible server (a URL ending in /v1) or Ollama's native API (any other URL), or the kind
given with --endpoint-kind. The reply becomes the task's own record (runner/endpoints.py), printed,
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
NOT_HERE = {"runtime": None, "device": "auto", "dtype": "auto", "server": None, "offline": False}


def endpoint_params() -> list[click.Parameter]:
    """--endpoint, --endpoint-kind, --api-key-env (generate and embed; `run chat` has its own)."""
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
    ]


def make_endpoint(url: str, model: str | None, kind: str | None, api_key_env: str | None):
    from taskrun.pipelines.llm.endpoint_client import Endpoint

    return Endpoint.from_url(url, model or "", kind or "", api_key_env or "")


def execute_endpoint(
    task: Task, *, inputs, values, common: dict, extras: dict, endpoint: str, endpoint_kind, api_key_env
) -> None:
    """A generate or embed command's job(s) on ``endpoint``, printed and written as `execute` does."""
    from taskrun.runner.inputs import gather_inputs, options_from
    from taskrun.runner.output.writer import pick_format
    from taskrun.runner.runlog.store import RunLog

    given = [k for k, v in NOT_HERE.items() if common.get(k) != v] + (["then"] if extras.get("then") else [])
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise TaskError(f"{flags}: not with --endpoint (the endpoint runs its own model); drop them")
    ep = make_endpoint(endpoint, common["model"], endpoint_kind, api_key_env)
    fmt = pick_format(task, common["fmt"], common["output"])
    json_mode = common["json_mode"] or fmt == "json"
    options = options_from(task, values, fmt)
    _refuse_unsent(task, options)
    items = gather_inputs(task, inputs, common["files"])
    log = RunLog(common["log_db"])
    if task.name == "embed":
        from taskrun.runner.endpoints import embed_job

        rec = embed_job(ep, items, options, log=log)
        _finish(task, rec, _printer(task, options, fmt, common, json_mode), fmt, common, json_mode)
        return
    for item in items:
        _generate_one(task, ep, item, options, log, fmt, common, json_mode)


def _refuse_unsent(task: Task, options) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(task.Options)}
    unsent = [k for k in NOT_SENT if k in defaults and getattr(options, k) != defaults[k]]
    if unsent:
        flags = ", ".join("--" + k.replace("_", "-") for k in unsent)
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
        printer(it)
    printer(ev.Done(rec.metrics))
    emit(task, rec, fmt, common["output"], json_mode, common["quiet"])
