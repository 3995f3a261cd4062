"""`run tasks`, `run models`, `run logs`: what taskrun can do, with what, and what it did."""

from __future__ import annotations

import json

import click

from taskrun.runner.output import fmt_value, print_json


@click.command("tasks")
@click.option("--json", "json_mode", is_flag=True, help="Print the registry as JSON.")
def tasks_cmd(json_mode):
    """What each task takes, returns and measures, and its default model: pick the task first."""
    from taskrun.models.resolve import aliases, load_config
    from taskrun.tasks import REGISTRY

    defaults = load_config().get("defaults", {})
    rows = []
    for name, task in REGISTRY.items():
        d = task.describe()
        d["default_models"] = {k: v for k, v in defaults.items() if k == name or k.startswith(name + ":")}
        d["default_sources"] = {v: aliases().get(v, {}).get("pip") or aliases().get(v, {}).get("hub", "")
                                for v in d["default_models"].values()}
        rows.append(d)
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
@click.option("--offline/--online", default=True, show_default=True,
              help="Offline (default) lists what is here without reaching the hub.")
def models_cmd(json_mode, offline):
    """Every known model: available here or not, size, digest, runtime and the tasks it serves."""
    from taskrun.models.resolve import list_models

    rows = list_models(offline=offline)
    if json_mode:
        print_json(rows)
        return
    for r in rows:
        mark = click.style("✓", fg="green") if r["available"] else click.style("✗", fg="red")
        click.echo(f"{mark} {click.style(r['name'], bold=True)}  {r['description']}")
        if r["available"]:
            click.echo(f"    tasks {', '.join(r['tasks'])}   runtime {r['runtime']}"
                       f" (also {', '.join(x for x in r['runtimes'] if x != r['runtime']) or '-'})"
                       f"   {r['size_bytes'] / 1e6:.1f} MB   {r['digest'][:23]}")
            click.echo(f"    {r['architecture']}, {r['source']}: {r['path']}")
        else:
            click.echo(f"    {r['why']}")
        if r["default_for"]:
            click.echo(f"    default for {', '.join(r['default_for'])}")


@click.group("logs", invoke_without_command=True)
@click.option("-n", "limit", default=20, show_default=True, help="How many recent runs.")
@click.option("--task", help="Only runs of this task.")
@click.option("--chain", "chain_id", help="Only the stages of this chain id.")
@click.option("--json", "json_mode", is_flag=True)
@click.option("--log-db", type=click.Path(dir_okay=False), envvar="TASKRUN_LOG_DB")
@click.pass_context
def logs_cmd(ctx, limit, task, chain_id, json_mode, log_db):
    """Recent runs from the run log (`run logs show ID` for one whole)."""
    from taskrun.runner.runlog import RunLog

    ctx.obj = {"log_db": log_db}
    if ctx.invoked_subcommand:
        return
    rows = RunLog(log_db).recent(limit, task=task, chain_id=chain_id)
    if json_mode:
        print_json(rows)
        return
    if not rows:
        click.echo("no runs logged yet", err=True)
    for r in rows:
        status = {"ok": "ok", "partial": "PARTIAL", "failed": "FAILED"}.get(r["status"], r["status"])
        wall = (r.get("metrics") or {}).get("wall_s")
        click.echo(f"{r['id']}  {r['started_at'][:19]}  {r['task']:<10} {status:<7} "
                   f"{r.get('model') or '-':<18} {fmt_value(wall) + 's' if wall is not None else '':>8}  "
                   f"{(r.get('error') or r.get('summary') or '')[:70]}")


@logs_cmd.command("show")
@click.argument("run_id")
@click.option("--log-db", type=click.Path(dir_okay=False), envvar="TASKRUN_LOG_DB")
@click.pass_context
def logs_show(ctx, run_id, log_db):
    """One run, whole, as JSON."""
    from taskrun.runner.runlog import RunLog

    row = RunLog(log_db or (ctx.obj or {}).get("log_db")).get(run_id)
    if row is None:
        raise click.ClickException(f"no run with id {run_id} (or the prefix matches several); "
                                   f"`run logs` lists them")
    click.echo(json.dumps(row, indent=2, ensure_ascii=False))
