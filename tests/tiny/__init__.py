"""Tiny random models of the real architectures, built in code, one module per task.

Each ``tests/tiny/<task>.py`` defines ``case(root: Path, runtime: str) -> TinyCase``: a saved tiny
model and inputs that the task accepts on that runtime. The contract test (tests/test_contract.py)
runs every (task, runtime) row of the pipelines table through the CLI on its tiny case, so a new
task or runtime without one fails the suite.
Builders are seeded and cached under ``root`` (built once per test run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TinyCase:
    model: str  # a local folder or file that --model accepts
    args: list[str]  # positional CLI arguments (texts or file paths)
    options: list[str] = field(default_factory=list)  # extra CLI options, e.g. ["--labels", "a,b"]
    runtime: str | None = None
    aliases: dict = field(default_factory=dict)  # extra models.toml entries the model needs


def no_case(task: str, runtime: str):
    raise LookupError(f"tests/tiny/{task}.py has no tiny case for the {runtime} runtime; add one")


def once(root: Path, name: str) -> tuple[Path, bool]:
    """(folder, exists): the folder for a tiny model and whether it was already built."""
    d = root / name
    return d, (d / ".done").exists()


def done(folder: Path) -> None:
    (folder / ".done").write_text("ok")


def models_toml_with(aliases: dict, folder: Path) -> Path:
    """A models.toml: the shipped one plus ``aliases`` (for TASKRUN_MODELS_TOML)."""
    import tomllib

    from taskrun.models.resolve import CONFIG_DIR

    config = tomllib.loads((CONFIG_DIR / "models.toml").read_text())
    config["models"].update(aliases)
    lines = ["[defaults]"] + [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in config["defaults"].items()]
    for name, entry in config["models"].items():
        # JSON strings, numbers, booleans and arrays of them read back as TOML values
        lines.append(f"\n[models.{json.dumps(name)}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in entry.items() if not isinstance(v, dict)]
        for k, v in entry.items():
            if isinstance(v, dict):
                lines.append(f"[models.{json.dumps(name)}.{k}]")
                lines += [f"{kk} = {json.dumps(vv)}" for kk, vv in v.items()]
    path = folder / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
