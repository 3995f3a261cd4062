"""`run bench TASK`: taskrun against the engine a user would otherwise pick, measured side by side,
each in a process of its own (runner/bench/core.py times; runner/bench/suites.py, embed.py,
classify.py and more.py say what).

    run bench transcribe                      # vs faster-whisper (greedy, beam 5, batched)
    run bench embed --against sentence-transformers --rounds 5
    run bench classify --json > classify.json

A reference that is not installed is skipped with a line saying so. Numbers from a busy machine
are noisy: the ratios (same run, interleaved rounds) are what to compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from taskrun.tasks.base import TaskError

# Stolen CPU time above this share makes a run's ratios suspect: on this project's VMs 1-3 % was
# usual on a quiet evening, and the steal lands on whichever contender is running at the time
NOISY_STEAL_PCT = 5.0
DEFAULT_TIMEOUT_S = 1800.0  # per load or call: generous for a long file, but never forever

SUITES = {
    "transcribe": "taskrun.runner.bench.suites:transcribe",
    "embed": "taskrun.runner.bench.embed:embed",
    "classify": "taskrun.runner.bench.classify:classify",
    "generate": "taskrun.runner.bench.more:generate",
    "image": "taskrun.runner.bench.more:image",
}


def suite_for(task: str, model, against, data, quick):
    import importlib

    if task not in SUITES:
        raise TaskError(f"run bench knows {', '.join(SUITES)}; not '{task}'")
    mod, _, attr = SUITES[task].partition(":")
    return getattr(importlib.import_module(mod), attr)(model, tuple(against), [Path(p) for p in data], quick)


def bench(
    task: str,
    model: str | None = None,
    against: tuple[str, ...] = (),
    rounds: int = 3,
    data: tuple[str, ...] = (),
    quick: bool = False,
    on_run=None,
    isolate: bool = True,
    busy: int = 0,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> dict:
    """Build TASK's suite, measure it (cold, one warm-up, ``rounds`` interleaved rounds; each
    contender in a process of its own unless ``isolate`` is false; ``busy`` spinning neighbour
    processes beside it) and return the JSON result (runner/bench/core.py's report, with quality).
    A contender that fails, or whose load or call takes longer than ``timeout`` seconds, drops out
    and is listed under ``failed``; the others are still measured."""
    from taskrun.runner.bench.core import Skipped, busy_neighbours, can_isolate, measure, report
    from taskrun.runner.bench.host import cpu_ticks, host, steal_pct

    suite = suite_for(task, model, against, data, quick)
    facts = host(bandwidth=True)  # before any contender or busy neighbour warms the machine
    ticks = cpu_ticks()
    isolate = isolate and can_isolate()
    if not isolate:  # what it sets would reach the others, and come too late for itself
        for c in [c for c in suite.contenders if c.own_process]:
            suite.contenders.remove(c)
            suite.skipped.append(Skipped(c.name, "needs a process of its own (leave out --in-process)"))
    with busy_neighbours(busy):
        measured, trace = measure(
            suite.contenders, rounds, on_run=on_run, isolate=isolate, timeout=timeout, keep_going=True
        )
    ran = {m.name: m.output for m in measured if not m.failed}
    quality = suite.quality(ran) if suite.quality and ran else None
    return report(
        suite.task,
        suite.model,
        rounds,
        suite.units,
        suite.unit,
        measured,
        suite.skipped,
        trace,
        quality,
        isolated=isolate,
        busy=busy,
        host_facts=facts | {"cpu_steal_pct": steal_pct(ticks, cpu_ticks())},
    )


def table(result: dict) -> str:
    unit = result["unit"]
    where = "a process each" if result.get("isolated") else "one process"
    if result["host"].get("busy_neighbours"):
        where += f" · {result['host']['busy_neighbours']} busy neighbour(s)"
    lines = [
        f"{result['task']} · {result['model']} · {result['units_per_run']} {unit} per run · "
        f"{result['rounds']} rounds · {where} · {result['host']['cpus']} CPUs "
        f"(load {result['host']['load_average_1min']})" + _machine(result["host"]),
        f"{'contender':<26}{'cold s':>9}{'warm s':>9}{'spread':>8}{unit + '/s':>13}  quality / how",
    ]
    for r in result["contenders"]:
        q = " ".join(f"{k}={v}" for k, v in (r.get("quality") or {}).items())
        lines.append(
            f"{r['name']:<26}{r['cold_s']:>9.3f}{r['warm']['median_s']:>9.3f}"
            f"{r['warm']['spread']:>8.1%}{r[unit + '_per_s'] or 0:>13.2f}  {q or r['note']}"
        )
    for r in result["contenders"]:
        for note in r.get("ran", ()):
            lines.append(f"ran: {r['name']}: {note}")
    for s in result["skipped"]:
        lines.append(f"skipped: {s['name']}: {s['reason']}")
    for f in result.get("failed", []):
        lines.append(f"failed: {f['reason']}")
    for k, v in result["ratios"].items():
        lines.append(f"ratio {k}: {v}x")
    stolen = result["host"].get("cpu_steal_pct")
    if stolen is not None and stolen >= NOISY_STEAL_PCT:
        lines.append(
            f"noisy host: the hypervisor took {stolen}% of this VM's CPU time during the run, "
            f"and unevenly: the ratios may be off by more than the spreads show; rerun when it is quieter"
        )
    return "\n".join(lines)


def _machine(facts: dict) -> str:
    """The header's second line: the CPU, its relevant instruction sets, the measured memory
    bandwidth and the CPU time stolen during the run, those that are known."""
    parts = [facts["cpu"]] if facts.get("cpu") else []
    if facts.get("isa"):
        parts.append(" ".join(facts["isa"]))
    if facts.get("memory_bandwidth_gbs"):
        parts.append(f"memory {facts['memory_bandwidth_gbs']} GB/s")
    if facts.get("cpu_steal_pct") is not None:
        parts.append(f"{facts['cpu_steal_pct']}% of CPU time stolen by the hypervisor during the run")
    return "\n" + " · ".join(parts) if parts else ""


@click.command("bench")
@click.argument("task", type=click.Choice(sorted(SUITES)))
@click.option(
    "--against",
    multiple=True,
    metavar="REF",
    help="Only these references (repeatable; a part of the name is enough): faster-whisper, "
    "sentence-transformers, onnxruntime, torch loop, transformers, llama.cpp, diffusers.",
)
@click.option("--model", "model", help="The model to measure (default: the task's default).")
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed rounds after the warm-up; contenders alternate order each round.",
)
@click.option(
    "--input",
    "data",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Data to measure on instead of the samples (audio files, photos, a text file of lines).",
)
@click.option("--quick", is_flag=True, help="Less data per run (a smoke run).")
@click.option(
    "--in-process",
    "in_process",
    is_flag=True,
    help="Run every contender in this one process instead of a process each (libraries that "
    "share a process can slow each other: see the README's Performance section).",
)
@click.option(
    "--busy",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    metavar="N",
    help="Run N processes spinning on the CPU beside the benchmark: how each contender fares on a shared machine.",
)
@click.option(
    "--timeout",
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0),
    metavar="S",
    help="The most seconds a contender's load or one run may take before its process is stopped "
    "and it is reported as failed (0: no limit; not enforced with --in-process).",
)
@click.option("--json", "json_mode", is_flag=True, help="Print the result as one JSON object.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Also write the JSON result here.")
def bench_cmd(task, against, model, rounds, data, quick, in_process, busy, timeout, json_mode, output):
    """Measure TASK in taskrun and in the reference engines, side by side.

    Each contender runs in a process of its own: it loads and runs once (cold), once more untimed
    (warm-up), then --rounds timed rounds, the contenders taking turns in alternating order; the
    table gives medians, their spread ((max-min)/median) and taskrun's throughput over each
    reference's. A contender that fails or passes --timeout drops out, the others finish, and the
    command exits with status 1.
    """

    def progress(name, r, dt):
        if not json_mode:
            click.echo(f"  round {r}: {name} {dt:.3f} s", err=True)

    result = bench(
        task,
        model,
        against,
        rounds,
        data,
        quick,
        on_run=progress,
        isolate=not in_process,
        busy=busy,
        timeout=timeout or None,
    )
    if output:
        from taskrun.tasks.base import atomic_write

        atomic_write(Path(output), (json.dumps(result, indent=1) + "\n").encode())
    click.echo(json.dumps(result) if json_mode else table(result))
    sys.stdout.flush()
    if result["failed"]:
        names = ", ".join(f["name"] for f in result["failed"])
        raise click.ClickException(f"{len(result['failed'])} contender(s) failed: {names} (their reasons are above)")
