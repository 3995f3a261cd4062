"""The eval loop: every case on every setup, retried until accepted up to ``attempts`` times,
``concurrency`` cases of an endpoint setup at a time (the demand expected; a local setup runs
one at a time). Setups run one after another,
so one setup's load never slows another's timings."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from taskrun.runner.eval.attempt import Attempt, run_attempt
from taskrun.runner.eval.cases import Case
from taskrun.runner.eval.setups import Setup


def run_case(case: Case, setup: Setup, *, attempts: int, eval_id: str, seed, log, judge=None) -> list[Attempt]:
    tries: list[Attempt] = []
    for n in range(1, attempts + 1):
        # a new seed per retry (seed + n - 1): the same seed at temperature > 0 would repeat the answer
        a = run_attempt(
            case, setup, n, eval_id=eval_id, seed=None if seed is None else seed + n - 1, log=log, judge=judge
        )
        tries.append(a)
        if a.accepted:
            break
    return tries


def run_eval(
    cases: list[Case],
    setups: list[Setup],
    *,
    attempts: int = 1,
    concurrency: int = 1,
    eval_id: str,
    seed=None,
    log=None,
    judge=None,
    on_case=None,
) -> dict[str, dict[str, list[Attempt]]]:
    """{setup name: {case id: its attempts}}; ``on_case(setup, case, attempts)`` as each ends."""
    out: dict[str, dict[str, list[Attempt]]] = {}
    for setup in setups:
        out[setup.name] = {}

        def one(case: Case, setup: Setup = setup) -> tuple[Case, list[Attempt]]:
            return case, run_case(case, setup, attempts=attempts, eval_id=eval_id, seed=seed, log=log, judge=judge)

        # A local setup answers one case at a time: the in-process engine is one model with one
        # state, and concurrent jobs on it gave other answers at temperature 0 than one at a time
        # (tests/test_eval_paths.py). Concurrent demand is sent to endpoints (`run serve` batches).
        workers = max(1, concurrency) if setup.endpoint else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for case, tries in pool.map(one, cases):
                out[setup.name][case.id] = tries
                if on_case:
                    on_case(setup, case, tries)
    return out
