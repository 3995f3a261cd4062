"""`run tasks`, `run models`, `run fit`, `run logs`: what taskrun can do, with what, and what it did."""

from __future__ import annotations

import json

import click

from taskrun.runner.output.terminal import for_terminal
from taskrun.runner.output.writer import fmt_value, print_json
from taskrun.tasks.base import TaskError


@click.command("tasks")
@click.option("--json", "json_mode", is_flag=True, help="Print the registry as JSON.")
def tasks_cmd(json_mode):
    """What each task takes, returns and measures, and its default model: pick the task first."""
    from taskrun.models.resolve import task_catalogue

    rows = task_catalogue()
    if json_mode:
        print_json(rows)
        return
    for d in rows:
        click.secho(f"{d['task']}", bold=True, nl=False)
        click.echo(f"  {d['summary']}")
        click.echo(f"  takes     {d['takes']}")
        click.echo(f"  returns   {d['returns']}")
        click.echo(f"  measures  {', '.join(m['name'] for m in d['measures'])}")
        opts = ", ".join(o["flags"][0] for o in d["options"])
        if opts:
            click.echo(f"  options   {opts}")
        for key, alias in d["default_models"].items():
            src = d["default_sources"].get(alias)
            when = f" ({key.split(':', 1)[1]} input)" if ":" in key else ""
            click.echo(f"  default   {alias}{when}" + (f"  from {src}" if src else ""))
        click.echo("")


@click.command("models")
@click.option("--json", "json_mode", is_flag=True)
@click.option(
    "--offline/--online",
    default=True,
    show_default=True,
    help="Offline (default) lists what is here without reaching the hub.",
)
def models_cmd(json_mode, offline):
    """Every known model: available here or not, size, digest, runtime, the tasks it serves, and
    its parameters, quantisation, licence and provenance (registry packages, upstream)."""
    from taskrun.models.resolve import list_models

    rows = list_models(offline=offline)
    if json_mode:
        print_json(rows)
        return
    for r in rows:
        mark = click.style("✓", fg="green") if r["available"] else click.style("✗", fg="red")
        click.echo(f"{mark} {click.style(r['name'], bold=True)}  {r['description']}")
        if r["available"]:
            click.echo(
                f"    tasks {', '.join(r['tasks'])}   runtime {r['runtime']}"
                f" (also {', '.join(x for x in r['runtimes'] if x != r['runtime']) or '-'})"
                f"   {r['size_bytes'] / 1e6:.1f} MB   {r['digest'][:23]}"
            )
            where = "" if r.get("provenance") else f", {r['source']}"  # else its packages are named below
            click.echo(f"    {r['architecture']}{where}: {r['path']}")
        else:
            click.echo(f"    {r['why']}")
        what = [
            f"{r['parameters']} parameters" if r.get("parameters") else "",
            r.get("quantisation", ""),
            f"licence {r['licence']}" if r.get("licence") else "",
        ]
        if any(what):
            click.echo("    " + ", ".join(x for x in what if x))
        if r.get("provenance"):
            click.echo(f"    from {r['provenance']}")
        if r["default_for"]:
            click.echo(f"    default for {', '.join(r['default_for'])}")


@click.command("fit")
@click.argument("model")
@click.option("--context", "context", type=int, required=True, help="Tokens of context (prompt + answer).")
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences decoded at once.")
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="Weights and KV cache dtype (taskrun's CPU default is float32).",
)
@click.option("--json", "json_mode", is_flag=True, help="Print the estimate as JSON.")
@click.option("--offline", is_flag=True, help="Never reach the network for models.")
@click.option(
    "--runtime",
    default=None,
    help="Estimate for this runtime (default: the model's, as "
    "`run generate` picks it; llama.cpp for a GGUF, transformers otherwise).",
)
def fit_cmd(model, context, batch, dtype, json_mode, offline, runtime):
    """Estimate whether MODEL fits in memory at --context tokens and --batch sequences.

    Reads only the model's config (or GGUF header): nothing is loaded. Memory = weights (at
    --dtype, as taskrun runs them) + KV cache (2 × layers × kv-heads × head-dim × context × batch)
    + a fixed runtime overhead, against the RAM available now.
    """
    from taskrun.models.fit import estimate_fit as estimate

    if context <= 0 or batch <= 0:
        raise TaskError("--context and --batch must be at least 1")
    est = estimate(model, context, batch, dtype, offline, runtime)
    if json_mode:
        click.echo(json.dumps(est))
        return
    gib = 1024**3
    click.echo(
        f"model      {est['model']} ({est['architecture']}, {est['params'] / 1e6:.0f}M parameters, "
        f"{est['layers']} layers, window {est['max_context']})"
    )
    click.echo(f"weights    {est['weights_bytes'] / gib:.2f} GiB ({est['dtype']}, {est['runtime']})")
    click.echo(f"kv cache   {est['kv_bytes'] / gib:.2f} GiB ({context} tokens × batch {batch})")
    click.echo(f"overhead   {est['overhead_bytes'] / gib:.2f} GiB (runtime, activations)")
    click.echo(f"total      {est['total_bytes'] / gib:.2f} GiB; available {est['available_bytes'] / gib:.2f} GiB")
    for note in est["notes"]:
        click.echo(f"note       {note}")
    verdict = "fits" if est["fits"] else "does NOT fit"
    click.secho(f"verdict    {verdict}", bold=True, fg="green" if est["fits"] else "red")
    if not est["fits"]:
        raise SystemExit(1)


@click.group("logs", invoke_without_command=True)
@click.option("-n", "limit", default=20, show_default=True, type=click.IntRange(min=1), help="How many recent runs.")
@click.option("--task", help="Only runs of this task.")
@click.option("--chain", "chain_id", help="Only the stages of this chain id.")
@click.option(
    "--search",
    "text",
    metavar="TEXT",
    help="Only runs whose kept texts (prompts, answers, transcripts) hold every word of TEXT.",
)
@click.option("--json", "json_mode", is_flag=True)
@click.option("--log-db", type=click.Path(dir_okay=False), envvar="TASKRUN_LOG_DB")
@click.pass_context
def logs_cmd(ctx, limit, task, chain_id, text, json_mode, log_db):
    """Recent runs from the run log (`run logs show ID` for one whole, with its texts).

    A job killed before it could finish its row (SIGKILL, a power cut) is shown as interrupted
    once its process is gone."""
    from taskrun.runner.runlog.store import RunLog

    ctx.obj = {"log_db": log_db}
    if ctx.invoked_subcommand:
        return
    log = RunLog(log_db)
    if text is not None:
        if chain_id:
            raise TaskError("--search and --chain cannot be combined; search, then `run logs show ID`")
        rows = log.search(text, limit, task=task)
    else:
        rows = log.recent(limit, task=task, chain_id=chain_id)
    if json_mode:
        print_json(rows)
        return
    if not rows:
        click.echo("no runs found" if text is not None else "no runs logged yet", err=True)
    for r in rows:
        click.echo(_log_line(r))


_STATUS = {"ok": "ok", "partial": "PARTIAL", "failed": "FAILED", "interrupted": "INTERRUPTED", "running": "running"}


def _log_line(r: dict) -> str:
    status = _STATUS.get(r["status"], r["status"])
    wall = (r.get("metrics") or {}).get("wall_s")
    what = (r.get("error") or r.get("summary") or "").replace("\n", " ")
    what = for_terminal(what if len(what) <= 70 else what[:69] + "…")
    return (
        f"{r['id']}  {r['started_at'][:19]}  {r['task']:<10} {status:<7} "
        f"{r.get('model') or '-':<18} {fmt_value(wall) + 's' if wall is not None else '':>8}  {what}"
    )


@logs_cmd.command("show")
@click.argument("run_id")
@click.option("--log-db", type=click.Path(dir_okay=False), envvar="TASKRUN_LOG_DB")
@click.pass_context
def logs_show(ctx, run_id, log_db):
    """One run, whole, as JSON, with the texts it kept."""
    from taskrun.runner.runlog.store import RunLog

    log = RunLog(log_db or (ctx.obj or {}).get("log_db"))
    row = log.get(run_id)
    if row is None:
        raise click.ClickException(f"no run with id {run_id} (or the prefix matches several); `run logs` lists them")
    row["texts"] = log.texts(row["id"])
    click.echo(json.dumps(row, indent=2, ensure_ascii=False))
