"""The measuring core of `run bench` and of benchmarks/*.py: contenders measured side by side in
one process, cold then warm, in interleaved rounds, reported as medians with their spread.

Why this shape: a shared or thermally throttled machine drifts over a run, so the contenders run
in alternating order (A B C, then C B A, ...) and a neighbour's burst lands on all of them; the
reference is always measured in the same run as taskrun, and only same-run ratios are reported.
"Cold" is the first call after loading (load time is reported apart); "warm" is the median of the
timed rounds after one untimed warm-up call.

Torch-free: what a contender runs is its own business (runner/bench_suites.py builds them).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Contender:
    """One way to do the task. ``load()`` loads whatever it needs and returns ``run``; ``run()``
    does the whole task once and returns its output (compared for quality by the suite)."""

    name: str
    load: Callable[[], Callable[[], Any]]
    role: str = "reference"  # "taskrun" or "reference"
    note: str = ""  # how it runs (dtype, batch size, decoding), for the report


@dataclass
class Skipped:
    """A reference that cannot run here (not installed), with the line that says so."""

    name: str
    reason: str


@dataclass
class Measured:
    name: str
    role: str
    note: str
    load_s: float = 0.0
    cold_s: float = 0.0
    runs_s: list[float] = field(default_factory=list)
    output: Any = None

    def summary(self, units: float, unit: str) -> dict:
        med = statistics.median(self.runs_s) if self.runs_s else self.cold_s
        lo, hi = (min(self.runs_s), max(self.runs_s)) if self.runs_s else (med, med)
        return {"name": self.name, "role": self.role, "note": self.note,
                "load_s": round(self.load_s, 4), "cold_s": round(self.cold_s, 4),
                "warm": {"median_s": round(med, 4), "min_s": round(lo, 4), "max_s": round(hi, 4),
                         "spread": round((hi - lo) / med, 4) if med else 0.0,
                         "runs_s": [round(t, 4) for t in self.runs_s]},
                f"{unit}_per_s": round(units / med, 3) if med else None}


def order_of(names: list[str], rounds: int) -> list[list[str]]:
    """Each round's order: forward, then reversed, alternately (a drift hits everyone alike)."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def measure(contenders: list[Contender], rounds: int, warmup: int = 1,
            clock: Callable[[], float] = time.perf_counter,
            on_run: Callable[[str, int, float], None] | None = None) -> tuple[list[Measured], list[str]]:
    """Load each contender and time its first (cold) call, then ``warmup`` untimed calls, then
    ``rounds`` interleaved timed rounds. Returns the measurements and the order things ran in
    ("load:NAME", "cold:NAME", "warmup:NAME", "round1:NAME", ...), which the JSON keeps."""
    done: dict[str, Measured] = {}
    runs: dict[str, Callable[[], Any]] = {}
    trace: list[str] = []
    for c in contenders:  # cold: load, then the first call
        t = clock()
        runs[c.name] = c.load()
        m = Measured(c.name, c.role, c.note, load_s=clock() - t)
        trace.append(f"load:{c.name}")
        t = clock()
        m.output = runs[c.name]()
        m.cold_s = clock() - t
        trace.append(f"cold:{c.name}")
        done[c.name] = m
    for _ in range(warmup):
        for c in contenders:
            runs[c.name]()
            trace.append(f"warmup:{c.name}")
    for r, names in enumerate(order_of([c.name for c in contenders], rounds)):
        for name in names:
            t = clock()
            done[name].output = runs[name]()
            dt = clock() - t
            done[name].runs_s.append(dt)
            trace.append(f"round{r + 1}:{name}")
            if on_run:
                on_run(name, r + 1, dt)
    return [done[c.name] for c in contenders], trace


def host() -> dict:
    """What the numbers were measured on (they mean little without it)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"machine": platform.machine(), "processor": platform.processor() or None, "cpus": cpus,
            "load_average_1min": None if load is None else round(load, 2), "python": platform.python_version()}


def ratios(rows: list[dict], unit: str) -> dict:
    """taskrun's warm throughput over each reference's, per taskrun contender (>1: taskrun faster)."""
    key = f"{unit}_per_s"
    ours = [r for r in rows if r["role"] == "taskrun" and r.get(key)]
    refs = [r for r in rows if r["role"] == "reference" and r.get(key)]
    return {f"{a['name']} / {b['name']}": round(a[key] / b[key], 3) for a in ours for b in refs}


def report(task: str, model: str, rounds: int, units: float, unit: str, measured: list[Measured],
           skipped: list[Skipped], trace: list[str], quality: dict | None = None) -> dict:
    """The JSON result of one bench run."""
    rows = [m.summary(units, unit) for m in measured]
    for row in rows:
        if quality and row["name"] in quality:
            row["quality"] = quality[row["name"]]
    return {"task": task, "model": model, "rounds": rounds, "unit": unit, "units_per_run": units,
            "contenders": rows, "skipped": [{"name": s.name, "reason": s.reason} for s in skipped],
            "ratios": ratios(rows, unit), "order": trace, "host": host()}
