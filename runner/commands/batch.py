"""`run batch`: the click command. Reads the input's structure first (nothing loads before it is
known to be whole and its ids unique), opens the output for resuming, runs the engine, and ends
with the summary on stderr and in the run log; exits non-zero when any item failed."""

from __future__ import annotations

import json

import click

from taskrun.tasks.base import TaskError


def _option_values(pairs: tuple[str, ...]) -> dict:
    """``-O key=value`` → {key: value}; a value is read as JSON when it is JSON (numbers, true,
    lists), else taken as a string."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise TaskError(f"-O {pair}: give an option as NAME=VALUE, e.g. -O language=en (see `run tasks`)")
        try:
            out[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip().replace("-", "_")] = value
    return out


def _speakers(ctx: click.Context) -> dict:
    """--speakers as the transcribe option it stands for."""
    return {"speakers": True} if ctx.meta.get("taskrun.speakers") else {}


def _workers(value: str, tasks: dict[str, int]) -> int:
    from taskrun.runner.batch.local import auto_workers

    if value == "auto":
        return auto_workers(tasks)
    if not value.isdigit() or int(value) < 1:
        raise TaskError(f"--workers {value}: give a number of processes (1 or more) or auto")
    return int(value)


@click.command("batch")
@click.argument("inputs", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="The output JSONL: one line per item, appended as items finish. Rerunning the same "
    "command resumes: items already in it are skipped.",
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False),
    help="Write side files here, named by item id: an SRT per transcript, the PNGs of image jobs.",
)
@click.option("-m", "--model", help="Model for items that name none (default: each task's default).")
@click.option("--runtime", help="Runtime for items that name none.")
@click.option(
    "-O",
    "--option",
    "options",
    multiple=True,
    metavar="NAME=VALUE",
    help="A task option for every taskrun job or file (a job's own options win), e.g. "
    "-O language=en -O batch_size=32. Repeatable.",
)
@click.option(
    "--speakers",
    is_flag=True,
    help="transcribe: say who spoke (as -O speakers=true); --out-dir then gets an RTTM beside each SRT.",
    expose_value=False,  # kept in ctx.meta: batch_cmd's signature stays within the function-size rule
    callback=lambda ctx, _p, value: ctx.meta.__setitem__("taskrun.speakers", value),
)
@click.option("--restart", is_flag=True, help="Empty the output first and run every item again.")
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Drop the failed items' lines from the output and run them again (the succeeded ones stay and are skipped).",
)
@click.option(
    "--chunk",
    default=256,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Items per job for tasks batched across items (embed, classify, detect, search): "
    "at most this many are lost when the process is killed.",
)
@click.option(
    "--workers",
    default="auto",
    show_default=True,
    help="Local engine: worker processes. auto: one per core for batches of 4 or more "
    "recordings to transcribe (Whisper's decoding leaves cores idle), else 1.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: this machine. ray: Ray Data actors (pip install 'taskrun[ray]').",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    help="An existing Ray cluster: auto, or HEAD:6379, with this "
    "command run on one of its nodes; default: a private one-machine cluster started for the "
    "job, on 127.0.0.1 only.",
)
@click.option(
    "--actors",
    default=1,
    show_default=True,
    type=click.IntRange(1, 4096),
    help="Ray engine: actors, each loading the model once.",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@click.option(
    "--dtype", default="auto", show_default=True, type=click.Choice(["auto", "float32", "bfloat16", "float16"])
)
@click.option("--offline", is_flag=True, help="Never reach the network for models.")
@click.option(
    "--log-db",
    type=click.Path(dir_okay=False),
    envvar="TASKRUN_LOG_DB",
    help="Run log SQLite file [env TASKRUN_LOG_DB].",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress; the summary only.")
def batch_cmd(
    inputs,
    output,
    out_dir,
    model,
    runtime,
    options,
    restart,
    retry_failed,
    chunk,
    workers,
    engine,
    ray_address,
    actors,
    device,
    dtype,
    offline,
    log_db,
    quiet,
):
    """Run many jobs from INPUT.jsonl (OpenAI Batch requests or taskrun jobs), or TASK over
    folders, globs and files, into one resumable JSONL.

    \b
      run batch requests.jsonl -o results.jsonl         OpenAI Batch format
      run batch jobs.jsonl -o results.jsonl             {"id", "task", "input", "options", "model"}
      run batch transcribe recordings/ -o t.jsonl --out-dir srt/
      run batch embed sentences.txt -o vectors.jsonl    one item per line
      run batch classify photos/ -o labels.jsonl --engine ray --actors 2

    A taskrun line's input is a text, a path, or a list of them. Relative paths are read from the
    current folder. Exits non-zero when any item failed (their lines say why).
    """
    from taskrun.runner.batch.run import Request, run_batch

    req = Request(
        inputs=inputs,
        output=output,
        out_dir=out_dir,
        model=model,
        runtime=runtime,
        options={**_option_values(options), **_speakers(click.get_current_context())},
        restart=restart,
        retry_failed=retry_failed,
        chunk=chunk,
        workers=workers,
        engine=engine,
        ray_address=ray_address,
        actors=actors,
        device=device,
        dtype=dtype,
        offline=offline,
        log_db=log_db,
        quiet=quiet,
    )
    outcome = run_batch(req, workers_of=_workers)
    if outcome.failed:
        raise click.ClickException(
            f"{outcome.failed} item(s) failed (their lines in {output} say why); fix them and rerun with --retry-failed"
        )
