"""The commands that run a chain file: `run chain` (any chain) and `run ask` (the ask-docs chain).
Registered in runner/cli.py EXTRA_COMMANDS."""

from __future__ import annotations

from pathlib import Path

import click

from taskrun.runner.chains.run import (
    ChainRun,
    StageView,
    allow_partial,
    check_chain,
    default_out_dir,
    load_chain,
    partial_steps,
    run_chain,
)
from taskrun.runner.output.terminal import for_terminal
from taskrun.runner.output.writer import EventPrinter, metrics_table, print_json
from taskrun.runner.runlog.store import RunLog

_common = [
    click.option(
        "-o",
        "--output-dir",
        "out_dir",
        type=click.Path(file_okay=False),
        help="Folder for the intermediate artifacts (default: a new one under ./taskrun-out/).",
    ),
    click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps."),
    click.option(
        "--dtype", default="auto", show_default=True, type=click.Choice(["auto", "float32", "bfloat16", "float16"])
    ),
    click.option("--json", "json_mode", is_flag=True, help="One JSON object for the whole chain on stdout."),
    click.option("--offline", is_flag=True, help="Never reach the network for models."),
    click.option(
        "--log-db",
        type=click.Path(dir_okay=False),
        envvar="TASKRUN_LOG_DB",
        help="Run log SQLite file [env TASKRUN_LOG_DB].",
    ),
    click.option("-q", "--quiet", is_flag=True, help="No progress or metrics on stderr."),
]


def common(f):
    for opt in reversed(_common):
        f = opt(f)
    return f


class ChainView(StageView):
    """A "── stage i/n ──" header before each step; each step's (or only the last's) results."""

    def __init__(
        self, n_steps: int, json_mode: bool, quiet: bool, only_last: bool, progress: bool | None = None
    ) -> None:
        self.n, self.json_mode, self.quiet, self.only_last = n_steps, json_mode, quiet, only_last
        self.progress = not quiet if progress is None else progress  # bars, even with quiet stages

    def begin(self, i, step) -> None:
        if not self.json_mode and not self.quiet:
            title = f" {step.title}" if step.title else ""
            click.secho(for_terminal(f"── stage {i + 1}/{self.n}:{title} ({step.task}) ──", 300), err=True, bold=True)

    def printer(self, i, task) -> EventPrinter:
        show_items = not self.only_last or i == self.n - 1
        return EventPrinter(task, None, json_mode=self.json_mode, quiet=not self.progress, show_items=show_items)


def _run(
    name_or_file,
    args,
    out_dir,
    device,
    dtype,
    json_mode,
    offline,
    log_db,
    quiet,
    only_last=False,
    progress=None,
    accept_partial=False,
) -> ChainRun:
    chain = load_chain(name_or_file)
    check_chain(chain)  # the wiring, before inputs are even looked at
    if accept_partial:
        chain = allow_partial(chain)
    out = Path(out_dir) if out_dir else default_out_dir(chain)
    view = ChainView(len(chain.steps), json_mode, quiet, only_last, progress)
    return run_chain(
        chain, tuple(args), out, device=device, dtype=dtype, offline=offline, log=RunLog(log_db), view=view
    )


def _report(run: ChainRun, headline: str) -> None:
    """Each stage's metrics table, then one line for the whole chain (on stderr)."""
    for i, rec in enumerate(run.records):
        click.secho(f"\n[stage {i + 1}: {rec.task}]", err=True, bold=True)
        click.echo(metrics_table(rec), err=True)
    click.secho(for_terminal(f"\n{headline} (chain id {run.chain_id}); artifacts in {run.out_dir}/"), err=True)


@click.command("chain")
@click.argument("name_or_file")
@click.argument("inputs", nargs=-1)
@common
@click.option(
    "--allow-partial",
    "accept_partial",
    is_flag=True,
    help="Accept a step's partial result (a recording cut short or damaged: transcribed as "
    "far as it goes, with a warning); without this the chain still runs and writes its "
    "artifacts, then exits non-zero.",
)
def chain_cmd(name_or_file, inputs, out_dir, device, dtype, json_mode, offline, log_db, quiet, accept_partial):
    """Run a chain of tasks (configs/chains/NAME.toml, or a TOML file) on INPUTS.

    \b
      run chain meeting-notes samples/meeting.wav
      run chain ask-docs "How far is Mars from the Sun?" samples/docs

    The whole chain is checked before anything loads. Each stage is a separate job in the run
    log, linked by a chain id; its text output is written to the output folder.
    """
    run = _run(
        name_or_file, inputs, out_dir, device, dtype, json_mode, offline, log_db, quiet, accept_partial=accept_partial
    )
    if json_mode:
        print_json(run.to_json())
    elif not quiet:
        _report(run, f"chain {run.chain.name}: {len(run.records)} stages in {run.wall_s:.2f} s")
    cut = partial_steps(run)
    if cut:  # shown, written and logged partial; not accepted
        raise click.ClickException(cut)


@click.command("ask")
@click.argument("question")
@click.option(
    "--docs",
    required=True,
    type=click.Path(exists=True),
    help="A folder (or file) of text/markdown documents to answer from.",
)
@common
def ask_cmd(question, docs, out_dir, device, dtype, json_mode, offline, log_db, quiet):
    """Answer QUESTION from the documents in --docs, citing passages [1], [2]… (the ask-docs chain)."""
    # Quiet stages, only the answer streamed: the sources and the numbers come after it. The
    # search index's progress bar still shows (on a terminal) while a changed corpus is embedded.
    run = _run(
        "ask-docs",
        (question, docs),
        out_dir,
        device,
        dtype,
        json_mode,
        offline,
        log_db,
        True,
        only_last=True,
        progress=not quiet,
    )
    if json_mode:
        print_json(run.to_json())
        return
    hits = run.records[0].results[0].hits if run.records and run.records[0].results else []
    click.echo("\nSources:")
    for i, h in enumerate(hits, 1):
        click.echo(for_terminal(f"  [{i}] {h.file}:{h.line_start}-{h.line_end}  (score {h.score:.3f})"))
    if not quiet:
        _report(run, f"ask: {run.wall_s:.2f} s")
