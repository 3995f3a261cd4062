"""`run eval CASES --setup SETUP ...`: the same cases and checks over several setups (runner/eval/).
Registered in runner/cli.py EXTRA_COMMANDS."""

from __future__ import annotations

import json
import sys

import click

from taskrun.runner.runlog.store import RunLog


@click.command("eval")
@click.argument("cases_file", metavar="CASES", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--setup",
    "setups",
    multiple=True,
    required=True,
    help="A setup: MODEL[@opt=v,...], openai:URL#MODEL, ollama:URL#MODEL, or a setups .toml. Repeatable.",
)
@click.option("--attempts", default=1, show_default=True, type=click.IntRange(1), help="Tries per case until accepted.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1), help="Cases of a setup at a time.")
@click.option("--seed", type=int, default=None, help="Sampling seed of the first try (retries use seed+1, ...).")
@click.option(
    "--min-accept", type=click.FloatRange(0, 1), default=None, help="Acceptance level for the verdict, e.g. 0.9."
)
@click.option(
    "--judge-model",
    default="minilm",
    show_default=True,
    help="Embedding model for the cases' judge checks (cosine similarity to the reference).",
)
@click.option("--json", "json_mode", is_flag=True, help="One JSON object: per setup, per case, the verdict.")
@click.option(
    "--log-db",
    type=click.Path(dir_okay=False),
    envvar="TASKRUN_LOG_DB",
    help="Run log SQLite file [env TASKRUN_LOG_DB].",
)
def eval_cmd(cases_file, setups, attempts, concurrency, seed, min_accept, judge_model, json_mode, log_db):
    """Run the same acceptance test (CASES: JSONL or TOML) over several setups: accepted answers,
    retries, incomplete answers, latency and cost per accepted answer. Each attempt is a run-log
    row of one eval id: `run logs --chain ID`. Endpoint keys come only from api_key_env=VAR."""
    from taskrun.runner.eval import report
    from taskrun.runner.eval.cases import load_cases
    from taskrun.runner.eval.run import run_eval
    from taskrun.runner.eval.setups import parse_setup
    from taskrun.runner.jobs import new_id

    cases = load_cases(cases_file)
    judge = None
    if any("judge" in c.checks for c in cases):
        from taskrun.runner.eval.judge import make_judge

        judge = make_judge(judge_model)
    chosen = [s for text in setups for s in parse_setup(text)]
    eval_id = "eval-" + new_id()
    if concurrency > 1 and any(not s.endpoint for s in chosen):
        click.secho(
            f"note: --concurrency {concurrency} applies to endpoint setups; local setups answer one case at a time",
            err=True,
            fg="yellow",
        )
    click.echo(f"eval {eval_id}: {len(cases)} cases x {len(chosen)} setups", err=True)

    def progress(setup, case, tries):
        click.echo(f"  {setup.name}: {case.id} {report._mark(tries)}", err=True)

    results = run_eval(
        cases,
        chosen,
        attempts=attempts,
        concurrency=concurrency,
        eval_id=eval_id,
        seed=seed,
        log=RunLog(log_db),
        judge=judge,
        on_case=None if json_mode else progress,
    )
    summaries = {n: report.summarize(r) for n, r in results.items()}
    line = report.verdict(summaries, min_accept)
    if json_mode:
        # Full precision: to_jsonable's 6-decimal rounding is for display, and a cost per accepted
        # answer of a cheap hosted setup is often below 1e-6 dollars. The report holds plain values.
        click.echo(json.dumps(report.to_json(eval_id, results, summaries, line), ensure_ascii=False))
    else:
        click.echo(report.table(summaries))
        click.echo(report.ran(summaries))
        click.echo()
        click.echo(report.grid(results))
        click.echo(line)
        click.echo(f"attempts logged: run logs --chain {eval_id}", err=True)
    if min_accept is not None and not any(s["accept_rate"] >= min_accept for s in summaries.values()):
        sys.exit(1)
