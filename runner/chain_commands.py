"""The `chain`, `ask` and `fit` commands (registered in runner/cli.py EXTRA_COMMANDS)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from taskrun.tasks.base import TaskError

_common = [
    click.option("-o", "--output-dir", "out_dir", type=click.Path(file_okay=False),
                 help="Folder for the intermediate artifacts (default: a new one under ./taskrun-out/)."),
    click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps."),
    click.option("--dtype", default="auto", show_default=True,
                 type=click.Choice(["auto", "float32", "bfloat16", "float16"])),
    click.option("--json", "json_mode", is_flag=True, help="One JSON object for the whole chain on stdout."),
    click.option("--offline", is_flag=True, help="Never reach the network for models."),
    click.option("--log-db", type=click.Path(dir_okay=False), envvar="TASKRUN_LOG_DB",
                 help="Run log SQLite file [env TASKRUN_LOG_DB]."),
    click.option("-q", "--quiet", is_flag=True, help="No progress or metrics on stderr."),
]


def common(f):
    for opt in reversed(_common):
        f = opt(f)
    return f


def _run(name_or_file, args, out_dir, device, dtype, json_mode, offline, log_db, quiet, only_last=False):
    from taskrun.runner.chains import check_chain, default_out_dir, load_chain, run_chain
    from taskrun.runner.output import EventPrinter, metrics_table, print_json
    from taskrun.runner.runlog import RunLog

    chain = load_chain(name_or_file)
    check_chain(chain)  # the wiring, before inputs are even looked at
    out = Path(out_dir) if out_dir else default_out_dir(chain)
    show = not json_mode
    last = {}

    def on_stage(i, step):
        if show and not quiet:
            title = f" {step.title}" if step.title else ""
            click.secho(f"── stage {i + 1}/{len(chain.steps)}:{title} ({step.task}) ──", err=True, bold=True)

    def printer_for(task, opts):
        last["n"] = last.get("n", 0) + 1
        show_items = not only_last or last["n"] == len(chain.steps)
        return EventPrinter(task, opts, json_mode=json_mode, quiet=quiet, show_items=show_items)

    run = run_chain(chain, tuple(args), out, device=device, dtype=dtype, offline=offline,
                    log=RunLog(log_db), printer_for=printer_for, on_stage=on_stage)
    if json_mode:
        print_json(run.to_json())
    elif not quiet:
        for i, rec in enumerate(run.records):
            click.secho(f"\n[stage {i + 1}: {rec.task}]", err=True, bold=True)
            click.echo(metrics_table(rec), err=True)
        click.secho(f"\nchain {chain.name}: {len(run.records)} stages in {run.wall_s:.2f} s "
                    f"(chain id {run.chain_id}); artifacts in {run.out_dir}/", err=True)
    return run


@click.command("chain")
@click.argument("name_or_file")
@click.argument("inputs", nargs=-1)
@common
def chain_cmd(name_or_file, inputs, out_dir, device, dtype, json_mode, offline, log_db, quiet):
    """Run a chain of tasks (configs/chains/NAME.toml, or a TOML file) on INPUTS.

    \b
      run chain meeting-notes samples/meeting.wav
      run chain ask-docs "How far is Mars from the Sun?" samples/docs

    The whole chain is checked before anything loads. Each stage is a separate job in the run
    log, linked by a chain id; its text output is written to the output folder.
    """
    _run(name_or_file, inputs, out_dir, device, dtype, json_mode, offline, log_db, quiet)


@click.command("ask")
@click.argument("question")
@click.option("--docs", required=True, type=click.Path(exists=True),
              help="A folder (or file) of text/markdown documents to answer from.")
@common
def ask_cmd(question, docs, out_dir, device, dtype, json_mode, offline, log_db, quiet):
    """Answer QUESTION from the documents in --docs, citing passages [1], [2]… (the ask-docs chain)."""
    run = _run("ask-docs", (question, docs), out_dir, device, dtype, json_mode, offline, log_db, True,
               only_last=True)
    if json_mode:
        return
    hits = run.records[0].results[0].hits if run.records and run.records[0].results else []
    click.echo("\nSources:")
    for i, h in enumerate(hits, 1):
        click.echo(f"  [{i}] {h.file}:{h.line_start}-{h.line_end}  (score {h.score:.3f})")
    if not quiet:
        from taskrun.runner.output import metrics_table

        for i, rec in enumerate(run.records):
            click.secho(f"\n[stage {i + 1}: {rec.task}]", err=True, bold=True)
            click.echo(metrics_table(rec), err=True)
        click.secho(f"\nask: {run.wall_s:.2f} s (chain id {run.chain_id}); artifacts in {run.out_dir}/",
                    err=True)


# --------------------------------------------------------------------------- fit


@click.command("fit")
@click.argument("model")
@click.option("--context", "context", type=int, required=True, help="Tokens of context (prompt + answer).")
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences decoded at once.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]),
              help="Weights and KV cache dtype (taskrun's CPU default is float32).")
@click.option("--json", "json_mode", is_flag=True, help="Print the estimate as JSON.")
@click.option("--offline", is_flag=True, help="Never reach the network for models.")
def fit_cmd(model, context, batch, dtype, json_mode, offline):
    """Estimate whether MODEL fits in memory at --context tokens and --batch sequences.

    Reads only the model's config (or GGUF header): nothing is loaded. Memory = weights (at
    --dtype, as taskrun runs them) + KV cache (2 × layers × kv-heads × head-dim × context × batch)
    + a fixed runtime overhead, against the RAM available now.
    """
    from taskrun.models.fit import estimate_fit as estimate

    if context <= 0 or batch <= 0:
        raise TaskError("--context and --batch must be at least 1")
    est = estimate(model, context, batch, dtype, offline)
    if json_mode:
        click.echo(json.dumps(est))
        return
    gib = 1024 ** 3
    click.echo(f"model      {est['model']} ({est['architecture']}, {est['params'] / 1e6:.0f}M parameters, "
               f"{est['layers']} layers, window {est['max_context']})")
    click.echo(f"weights    {est['weights_bytes'] / gib:.2f} GiB ({dtype})")
    click.echo(f"kv cache   {est['kv_bytes'] / gib:.2f} GiB ({context} tokens × batch {batch})")
    click.echo(f"overhead   {est['overhead_bytes'] / gib:.2f} GiB (runtime, activations)")
    click.echo(f"total      {est['total_bytes'] / gib:.2f} GiB; available {est['available_bytes'] / gib:.2f} GiB")
    for note in est["notes"]:
        click.echo(f"note       {note}")
    verdict = "fits" if est["fits"] else "does NOT fit"
    click.secho(f"verdict    {verdict}", bold=True, fg="green" if est["fits"] else "red")
    if not est["fits"]:
        raise SystemExit(1)

