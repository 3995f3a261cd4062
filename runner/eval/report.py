"""The numbers of an eval: per setup (accepted / total, first-try acceptance, incomplete, errors,
retries, TTFT and completion p50/p95, output tok/s, tokens, cost, cost and time per accepted
answer), the per-case grid and the verdict. Every number is computed from the attempts, which
are the run log's rows, so it can be checked from ``run logs --chain ID``."""

from __future__ import annotations

import math

from taskrun.runner.eval.attempt import Attempt


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile, nearest rank (no interpolation: a reported value was measured)."""
    v = sorted(values)
    return v[max(0, math.ceil(q / 100 * len(v)) - 1)] if v else None


def summarize(results: dict[str, list[Attempt]]) -> dict:
    tries = [a for attempts in results.values() for a in attempts]
    answered = [a for a in tries if not a.error]
    accepted = sum(any(a.accepted for a in attempts) for attempts in results.values())
    first = sum(bool(attempts) and attempts[0].accepted for attempts in results.values())
    time_s = sum(a.completion_s for a in tries)
    cost = sum(a.cost for a in tries)
    out_tok = sum(a.output_tokens for a in answered)
    return {
        "cases": len(results),
        "accepted": accepted,
        "accept_rate": accepted / len(results) if results else 0.0,
        "first_try": first,
        "attempts": len(tries),
        "incomplete": sum(a.incomplete for a in tries),
        "errors": sum(bool(a.error) for a in tries),
        "retries": sum(a.retries for a in tries) + len(tries) - len(results),  # HTTP retries + repeated attempts
        "ttft_p50_s": pct([a.ttft_s for a in answered if a.ttft_s is not None], 50),
        "ttft_p95_s": pct([a.ttft_s for a in answered if a.ttft_s is not None], 95),
        "completion_p50_s": pct([a.completion_s for a in answered], 50),
        "completion_p95_s": pct([a.completion_s for a in answered], 95),
        "output_tokens_per_s": out_tok / sum(a.completion_s for a in answered) if answered and out_tok else 0.0,
        "input_tokens": sum(a.input_tokens for a in answered),
        "output_tokens": out_tok,
        "time_s": time_s,
        "cost": cost,
        "cost_per_accepted": cost / accepted if accepted else None,
        "time_per_accepted_s": time_s / accepted if accepted else None,
        "ran": list(dict.fromkeys(a.ran for a in answered if a.ran)),  # more than one: the setup changed mid-eval
    }


def verdict(summaries: dict[str, dict], min_accept: float | None) -> str:
    ok = {
        n: s for n, s in summaries.items() if s["accepted"] and (min_accept is None or s["accept_rate"] >= min_accept)
    }
    if not ok:
        level = f" the acceptance level {min_accept:.0%}" if min_accept is not None else " any case"
        return f"verdict: no setup met{level}"
    fastest = min(ok, key=lambda n: ok[n]["time_per_accepted_s"])
    line = f"verdict: fastest per accepted answer: {fastest} ({ok[fastest]['time_per_accepted_s']:.3f} s)"
    if any(s["cost"] for s in ok.values()):
        cheapest = min(ok, key=lambda n: ok[n]["cost_per_accepted"])
        line += f"; cheapest per accepted answer: {cheapest} (${ok[cheapest]['cost_per_accepted']:.6f})"
    else:
        line += "; no prices given (set price_in/price_out or price_hour in a setups file for cost)"
    if min_accept is not None:
        line += f"; {len(ok)} of {len(summaries)} setups at or above {min_accept:.0%} accepted"
    return line


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


COLUMNS = [
    ("accepted", lambda s: f"{s['accepted']}/{s['cases']}"),
    ("first try", lambda s: str(s["first_try"])),
    ("incomplete", lambda s: str(s["incomplete"])),
    ("errors", lambda s: str(s["errors"])),
    ("retries", lambda s: str(s["retries"])),
    ("TTFT p50/p95 s", lambda s: f"{_f(s['ttft_p50_s'], '.3f')}/{_f(s['ttft_p95_s'], '.3f')}"),
    ("done p50/p95 s", lambda s: f"{_f(s['completion_p50_s'], '.3f')}/{_f(s['completion_p95_s'], '.3f')}"),
    ("tok/s", lambda s: f"{s['output_tokens_per_s']:.1f}"),
    ("tokens in/out", lambda s: f"{s['input_tokens']}/{s['output_tokens']}"),
    ("cost $", lambda s: f"{s['cost']:.6f}"),
    ("$/accepted", lambda s: _f(s["cost_per_accepted"], ".6f")),
    ("s/accepted", lambda s: _f(s["time_per_accepted_s"], ".3f")),
]


def table(summaries: dict[str, dict]) -> str:
    rows = [["setup", *[c for c, _ in COLUMNS]]] + [[n, *[f(s) for _, f in COLUMNS]] for n, s in summaries.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def ran(summaries: dict[str, dict]) -> str:
    """Per setup, what answered (runtime, device, dtype, digest, kernels; or the endpoint)."""
    return "\n".join(f"ran [{i + 1}] {n}: {' | '.join(s['ran']) or '-'}" for i, (n, s) in enumerate(summaries.items()))


def grid(results: dict[str, dict[str, list[Attempt]]]) -> str:
    """Which setup passed which case: ✓ first try, ✓N on try N, L incomplete, E error, ✗ rejected."""
    names = list(results)
    case_ids = list(next(iter(results.values()))) if results else []
    rows = [["case", *[f"[{i + 1}]" for i in range(len(names))]]]
    for cid in case_ids:
        rows.append([cid, *[_mark(results[n][cid]) for n in names]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    key = "  ".join(f"[{i + 1}] {n}" for i, n in enumerate(names))
    body = "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return body + "\n" + key + "\n(ok: accepted first try, okN: on try N, L: cut at max_tokens, E: error, x: rejected)"


def _mark(tries: list[Attempt]) -> str:
    for a in tries:
        if a.accepted:
            return "ok" if a.n == 1 else f"ok{a.n}"
    last = tries[-1]
    return "E" if last.error else "L" if last.incomplete else "x"


def to_json(eval_id: str, results, summaries, line: str) -> dict:
    return {
        "eval_id": eval_id,
        "setups": summaries,
        "cases": {
            n: {
                cid: [
                    {
                        k: getattr(a, k)
                        for k in (
                            "n",
                            "accepted",
                            "finish_reason",
                            "why",
                            "error",
                            "ttft_s",
                            "completion_s",
                            "input_tokens",
                            "output_tokens",
                            "retries",
                            "cost",
                            "row_id",
                            "ran",
                            "text",
                        )
                    }
                    for a in tries
                ]
                for cid, tries in per.items()
            }
            for n, per in results.items()
        },
        "verdict": line,
    }
