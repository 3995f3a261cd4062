"""The measuring core of `run bench` and of benchmarks/*.py: contenders measured side by side in
one process, cold then warm, in interleaved rounds, reported as medians with their spread.

Why this shape: a shared or thermally throttled machine drifts over a run, so the contenders run
in alternating order (A B C, then C B A, ...) and a neighbour's burst lands on all of them; the
reference is always measured in the same run as taskrun, and only same-run ratios are reported.
"Cold" is the first call after loading (load time is reported apart); "warm" is the median of the
timed rounds after one untimed warm-up call.

Isolated (``measure(..., isolate=True)``, what `run bench` does): each contender loads and runs
in a fresh process of its own, as a user's program would run it. In one process the libraries
disturb each other: a second CTranslate2 model that had run on two threads made faster-whisper's
own decoding ~2x slower for the rest of the process (benchmarks/README.md, "Transcribe"), and every reference ran
under taskrun's passive OpenMP waits instead of its own defaults. The parent only hands out turns,
in the same interleaved order, and each worker times its own call, so the pipe's cost is not in
the numbers. The workers are spawned, not forked: a fork of a process whose OpenMP pool has run
(a test process, a notebook) dies in its first parallel region. A contender's ``load`` closure
travels to its worker with cloudpickle.

A contender that fails (its worker raises, dies, or does not answer within ``timeout`` seconds and
is killed) stops the measurement, or with ``keep_going`` is dropped from the rounds and reported
as failed while the others finish: a hung reference must not hold the whole comparison. A
``TaskError`` (a model that does not resolve, say) always stops it: it is the user's to fix.

Torch-free: what a contender runs is its own business (runner/bench/suites.py builds them).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from taskrun.runner.bench.host import host


@dataclass
class Contender:
    """One way to do the task. ``load()`` loads whatever it needs and returns ``run``; ``run()``
    does the whole task once and returns its output (compared for quality by the suite)."""

    name: str
    load: Callable[[], Callable[[], Any]]
    role: str = "reference"  # "taskrun" or "reference"
    note: str = ""  # how it runs (dtype, batch size, decoding), for the report
    own_process: bool = False  # sets what a library reads once per process: never run in-process


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
    failed: str = ""  # why it dropped out (with keep_going): its error, or the timeout

    def summary(self, units: float, unit: str) -> dict:
        med = statistics.median(self.runs_s) if self.runs_s else self.cold_s
        lo, hi = (min(self.runs_s), max(self.runs_s)) if self.runs_s else (med, med)
        return {
            "name": self.name,
            "role": self.role,
            "note": self.note,
            "load_s": round(self.load_s, 4),
            "cold_s": round(self.cold_s, 4),
            "warm": {
                "median_s": round(med, 4),
                "min_s": round(lo, 4),
                "max_s": round(hi, 4),
                "spread": round((hi - lo) / med, 4) if med else 0.0,
                "runs_s": [round(t, 4) for t in self.runs_s],
            },
            f"{unit}_per_s": round(units / med, 3) if med else None,
        }


def order_of(names: list[str], rounds: int) -> list[list[str]]:
    """Each round's order: forward, then reversed, alternately (a drift hits everyone alike)."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def measure(
    contenders: list[Contender],
    rounds: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    on_run: Callable[[str, int, float], None] | None = None,
    isolate: bool = False,
    timeout: float | None = None,
    keep_going: bool = False,
) -> tuple[list[Measured], list[str]]:
    """Load each contender and time its first (cold) call, then ``warmup`` untimed calls, then
    ``rounds`` interleaved timed rounds. Returns the measurements and the order things ran in
    ("load:NAME", "cold:NAME", "warmup:NAME", "round1:NAME", ...), which the JSON keeps.
    ``isolate``: each contender in a process of its own (see the module's note); ``timeout``: the
    most seconds its load or any one call may take there before its worker is killed (None: no
    limit; a contender in this process cannot be stopped, so in-process there is none).
    ``keep_going``: a contender that fails is dropped, marked ``failed``, and the rest go on."""
    if isolate and can_isolate():
        with _Workers(contenders, clock, timeout) as workers:
            return _measure(contenders, rounds, warmup, workers.load, workers.call, on_run, keep_going)
    runs: dict[str, Callable[[], Any]] = {}

    def load(c: Contender) -> float:
        t = clock()
        runs[c.name] = c.load()
        return clock() - t

    def call(name: str, keep: bool) -> tuple[float, Any]:
        t = clock()
        out = runs[name]()
        return clock() - t, out

    return _measure(contenders, rounds, warmup, load, call, on_run, keep_going)


def _measure(contenders, rounds, warmup, load, call, on_run, keep_going=False):
    done = {c.name: Measured(c.name, c.role, c.note) for c in contenders}
    trace: list[str] = []

    def step(name: str, what: str, action: Callable[[], None]) -> None:
        """Run one step of a contender still in the race; with keep_going a failure drops it."""
        m = done[name]
        if m.failed:
            return
        try:
            action()
        except ContenderFailed as exc:
            if not keep_going:
                raise
            m.failed = str(exc)
            trace.append(f"failed:{name}")
            return
        trace.append(f"{what}:{name}")

    def cold(c: Contender) -> None:
        m = done[c.name]
        m.load_s = load(c)
        trace.append(f"load:{c.name}")
        m.cold_s, m.output = call(c.name, True)

    def timed(name: str, r: int) -> None:
        dt, out = call(name, True)
        done[name].output = out
        done[name].runs_s.append(dt)
        if on_run:
            on_run(name, r, dt)

    for c in contenders:  # cold: load, then the first call
        step(c.name, "cold", lambda c=c: cold(c))
    for _ in range(warmup):
        for c in contenders:
            step(c.name, "warmup", lambda c=c: call(c.name, False))
    for r, names in enumerate(order_of([c.name for c in contenders], rounds)):
        for name in names:
            step(name, f"round{r + 1}", lambda name=name, r=r: timed(name, r + 1))
    return [done[c.name] for c in contenders], trace


def can_isolate() -> bool:
    import importlib.util

    return importlib.util.find_spec("cloudpickle") is not None


class ContenderFailed(RuntimeError):
    """A contender's load or run raised in its worker process; the message is the worker's."""


def _serve(conn, payload: bytes, clock: Callable[[], float]) -> None:
    """A worker: load on the first message, then one timed call per message, until None."""
    import traceback

    try:
        conn.send(("ready", 0.0, None))  # booted: the parent starts no load while a worker still boots
        conn.recv()
        import cloudpickle

        load = cloudpickle.loads(payload)
        t = clock()
        run = load()
        conn.send(("ok", clock() - t, None))
        while (keep := conn.recv()) is not None:
            t = clock()
            out = run()
            dt = clock() - t
            conn.send(("ok", dt, out if keep else None))
    except EOFError:  # the parent is gone
        pass
    except BaseException as exc:
        from taskrun.tasks.base import TaskError

        said = str(exc) if isinstance(exc, TaskError) else f"{type(exc).__name__}: {exc}"
        try:
            conn.send(("task-error" if isinstance(exc, TaskError) else "error", said, traceback.format_exc()))
        except Exception:
            pass
    finally:
        conn.close()


class _Workers:
    """One fresh (spawned) process per contender, all started before any of them loads; each
    loads only when its turn comes."""

    def __init__(self, contenders: list[Contender], clock: Callable[[], float], timeout: float | None = None) -> None:
        import multiprocessing

        import cloudpickle

        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs, self.timeout = {}, {}, timeout
        try:
            for c in contenders:
                parent, child = ctx.Pipe()
                self.conns[c.name] = parent
                p = ctx.Process(target=_serve, args=(child, cloudpickle.dumps(c.load), clock), name=f"bench:{c.name}")
                p.start()
                child.close()
                self.procs[c.name] = p
            for name, conn in self.conns.items():  # every worker idle before the first load: what
                # loads sees a quiet machine, not its siblings' start-up (taskrun reads the load then)
                try:
                    ready = conn.poll(timeout or 600) and conn.recv()[0] == "ready"
                except (EOFError, OSError):
                    ready = False
                if not ready:
                    raise ContenderFailed(f"{name}: its worker process did not start")
        except BaseException:  # a loader that does not pickle, a process that cannot start
            self.__exit__()
            raise

    def _ask(self, name: str, msg) -> tuple[float, Any]:
        conn = self.conns[name]
        try:
            conn.send(msg)
            if self.timeout is not None and not conn.poll(self.timeout):
                self._kill(name)
                what = "load" if msg == "load" else "run"
                raise ContenderFailed(
                    f"{name}: its {what} gave no answer in {self.timeout:g} s and its worker "
                    f"was stopped (--timeout raises the limit)"
                )
            status, value, extra = conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise ContenderFailed(f"{name}: its worker process died (killed, or out of memory?)") from None
        if status == "task-error":  # the user's to fix (a model that does not resolve, say): as is
            from taskrun.tasks.base import TaskError

            raise TaskError(value)
        if status == "error":  # one line; the worker's traceback with TASKRUN_DEBUG=1
            detail = f"\n{extra}" if os.environ.get("TASKRUN_DEBUG", "") not in ("", "0") else ""
            raise ContenderFailed(f"{name}: {value}{detail}")
        return value, extra

    def load(self, c: Contender) -> float:
        return self._ask(c.name, "load")[0]

    def call(self, name: str, keep: bool) -> tuple[float, Any]:
        return self._ask(name, keep)

    def _kill(self, name: str) -> None:
        p = self.procs[name]
        p.kill()
        p.join()

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc) -> None:
        for conn in self.conns.values():
            try:
                conn.send(None)
            except OSError:
                pass
        for p in self.procs.values():
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
        for conn in self.conns.values():
            conn.close()


@contextmanager
def busy_neighbours(n: int):
    """``n`` processes spinning on the CPU for the duration: the shared machine, on purpose (a
    spinning OpenMP pool that wins on a quiet machine can collapse beside one busy process)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def ran_notes(output: Any) -> list[str]:
    """What a taskrun job's run log says ran beyond model, runtime and dtype (a converted copy, how
    CTranslate2's threads waited), from its record's card; [] for a reference's plain output."""
    card = getattr(output, "card", None)
    return list(getattr(card, "extra", None) and card.extra.get("ran") or ())


def ratios(rows: list[dict], unit: str) -> dict:
    """taskrun's warm throughput over each reference's, per taskrun contender (>1: taskrun faster)."""
    key = f"{unit}_per_s"
    ours = [r for r in rows if r["role"] == "taskrun" and r.get(key)]
    refs = [r for r in rows if r["role"] == "reference" and r.get(key)]
    return {f"{a['name']} / {b['name']}": round(a[key] / b[key], 3) for a in ours for b in refs}


def report(
    task: str,
    model: str,
    rounds: int,
    units: float,
    unit: str,
    measured: list[Measured],
    skipped: list[Skipped],
    trace: list[str],
    quality: dict | None = None,
    isolated: bool = False,
    busy: int = 0,
    host_facts: dict | None = None,
) -> dict:
    """The JSON result of one bench run. ``isolated``: each contender ran in its own process;
    ``busy``: that many spinning neighbour processes ran beside it. A contender that failed is
    listed under ``failed`` with its reason, not among the measured ones. ``host_facts``: what
    ``host()`` said before the contenders ran (the bandwidth probe belongs before them, on a
    machine they are not yet warming); read now when not given."""
    rows = [m.summary(units, unit) for m in measured if not m.failed]
    ran = {m.name: ran_notes(m.output) for m in measured if not m.failed}
    for row in rows:
        if quality and row["name"] in quality:
            row["quality"] = quality[row["name"]]
        if ran.get(row["name"]):
            row["ran"] = ran[row["name"]]
    return {
        "task": task,
        "model": model,
        "rounds": rounds,
        "unit": unit,
        "units_per_run": units,
        "contenders": rows,
        "skipped": [{"name": s.name, "reason": s.reason} for s in skipped],
        "failed": [{"name": m.name, "role": m.role, "reason": m.failed} for m in measured if m.failed],
        "ratios": ratios(rows, unit),
        "order": trace,
        "isolated": isolated,
        "host": (host_facts or host()) | {"busy_neighbours": busy},
    }
