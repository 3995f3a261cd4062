"""A case file (JSONL or TOML) and the acceptance checks each case carries.

A case: ``id``, ``prompt`` (or ``messages``: a list of {role, content}), optional ``system``, and
one or more checks: ``contains`` / ``not_contains`` (a text or a list; ``match = "all"`` (default)
or ``"any"``), ``regex``, ``equals`` (after normalisation: case, surrounding whitespace and
punctuation, inner runs of spaces), ``number`` (the answer's last number, within ``tolerance``, absolute), ``json_schema``
(the answer, or its first {...} or [...] block, must parse and validate), ``choices`` (the answer,
normalised, is one of a label set; ``label`` names the right one), ``judge`` (embedding cosine
similarity to ``reference`` at least ``threshold``). Every check given must pass.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from taskrun.tasks.base import TaskError

CHECKS = ("contains", "not_contains", "regex", "equals", "number", "json_schema", "choices", "judge")
KEYS = {"id", "prompt", "messages", "system", "match", "tolerance", "label", "reference", "threshold", "note", *CHECKS}


@dataclass
class Case:
    id: str
    messages: list[dict]
    checks: dict = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return self.messages[-1]["content"]


def load_cases(path: str) -> list[Case]:
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"{path}: no such case file; give a .jsonl or .toml file of cases")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".toml":
        try:
            raw = tomllib.loads(text).get("case", [])
        except tomllib.TOMLDecodeError as exc:
            raise TaskError(f"{path}: not valid TOML ({exc}); cases are [[case]] tables") from None
    else:
        raw = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    raw.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TaskError(f"{path}:{n}: not a JSON object ({exc.msg}); one case per line") from None
    if not raw:
        raise TaskError(f"{path}: no cases in it")
    cases = [_case(c, f"{path}:{i + 1}") for i, c in enumerate(raw)]
    ids = [c.id for c in cases]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise TaskError(f"{path}: case ids must be unique; repeated: {', '.join(dup)}")
    return cases


def _case(c: dict, where: str) -> Case:
    if not isinstance(c, dict):
        raise TaskError(f"{where}: a case is an object with a prompt and a check")
    unknown = sorted(set(c) - KEYS)
    if unknown:
        raise TaskError(f"{where}: unknown case keys {', '.join(unknown)}; known: {', '.join(sorted(KEYS))}")
    checks = {k: c[k] for k in CHECKS if k in c}
    if not checks:
        raise TaskError(f"{where}: the case has no check; add one of {', '.join(CHECKS)}")
    for k in ("match", "tolerance", "label", "reference", "threshold"):
        if k in c:
            checks[k] = c[k]
    if "judge" in checks and "reference" not in checks:
        checks["reference"] = checks["judge"]
    if "json_schema" in checks:
        import jsonschema

        try:
            jsonschema.validators.validator_for(checks["json_schema"]).check_schema(checks["json_schema"])
        except jsonschema.SchemaError as exc:
            raise TaskError(f"{where}: json_schema is not a valid schema ({exc.message})") from None
    if "regex" in checks:
        try:
            re.compile(checks["regex"])
        except re.error as exc:
            raise TaskError(f"{where}: regex does not compile ({exc})") from None
    messages = list(c.get("messages") or [])
    if "prompt" in c:
        messages.append({"role": "user", "content": str(c["prompt"])})
    if not messages or any(m.get("role") not in ("system", "user", "assistant") for m in messages):
        raise TaskError(f"{where}: give a prompt, or messages with roles user/assistant/system")
    if c.get("system"):
        messages.insert(0, {"role": "system", "content": str(c["system"])})
    return Case(str(c.get("id") or where), messages, checks)


def normalise(text: str) -> str:
    text = re.sub(r"\s+", " ", text.strip().lower())
    return text.strip(" .,;:!?\"'`*")


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def check(case: Case, answer: str, judge=None) -> tuple[bool, str]:
    """(accepted, why not) for an answer. ``judge(a, b) -> cosine`` for judge checks."""
    c = case.checks
    low = answer.lower()
    for key in ("contains", "not_contains"):
        if key in c:
            items = [c[key]] if isinstance(c[key], str) else list(c[key])
            hits = [s.lower() in low for s in items]
            if key == "contains":
                ok = any(hits) if c.get("match") == "any" else all(hits)
                if not ok:
                    return False, f"missing {[s for s, h in zip(items, hits, strict=True) if not h]}"
            elif all(hits) if c.get("match") == "all" and len(items) > 1 else any(hits):
                return False, f"holds {[s for s, h in zip(items, hits, strict=True) if h]}"
    if "regex" in c and not re.search(c["regex"], answer):
        return False, f"no match for /{c['regex']}/"
    if "equals" in c and normalise(answer) != normalise(str(c["equals"])):
        return False, f"not equal to {c['equals']!r}"
    if "number" in c:
        nums = [float(n.replace(",", "")) for n in NUMBER.findall(answer)]
        tol = float(c.get("tolerance", 0))
        # the answer's last number: "144 divided by 12 is 1.44" echoes the question's 12 first
        if not nums or abs(nums[-1] - float(c["number"])) > tol:
            return (
                False,
                f"the last number, {nums[-1]:g}, is not within {tol:g} of {c['number']}" if nums else "no number",
            )
    if "choices" in c:
        got = normalise(answer)
        labels = {normalise(x): x for x in c["choices"]}
        if got not in labels:
            return False, f"not one of {list(c['choices'])}"
        if "label" in c and got != normalise(c["label"]):
            return False, f"labelled {labels[got]!r}, expected {c['label']!r}"
    if "json_schema" in c:
        ok, why = _json_ok(answer, c["json_schema"])
        if not ok:
            return False, why
    if "judge" in c:
        if judge is None:
            raise TaskError(f"case {case.id}: a judge check needs an embedding model (--judge-model)")
        sim = judge(answer, c["reference"])
        if sim < float(c.get("threshold", 0.8)):
            return False, f"similarity {sim:.2f} < {float(c.get('threshold', 0.8)):.2f}"
    return True, ""


def _json_ok(answer: str, schema) -> tuple[bool, str]:
    import jsonschema

    text = answer.strip()
    m = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    if m:
        text = m.group(1).strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        m = re.search(r"[\[{].*[\]}]", text, re.S)
        try:
            value = json.loads(m.group(0)) if m else None
        except json.JSONDecodeError:
            value = None
        if value is None:
            return False, "not JSON"
    err = jsonschema.validators.validator_for(schema)(schema).iter_errors(value)
    first = next(iter(err), None)
    return (True, "") if first is None else (False, f"JSON invalid: {first.message[:80]}")
