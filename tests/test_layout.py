"""The shape of the package: one import name, imports that flow one way, no cycles, small units.

Layers, from the top: runner (the front doors: CLI, chains, run log) → pipelines (how a task
runs) → models (torch-free resolution) → tasks (what a task is). A module may import its own
layer or a lower one, never a higher one, and no set of modules may import each other in a ring,
lazy imports inside functions included (they are dependencies all the same).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from taskrun.pipelines.text.engine import TextEncoderEngine

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["tasks", "models", "pipelines", "runner"]  # lowest first
# The front doors inside runner/: none may import another (the wire formats they share live in
# tasks/wire/, the job runner and output in runner/'s shared modules). commands/ and cli.py are
# the click layer over all of them.
DOORS = {"serve", "batch", "remote", "chains", "bench", "eval", "api"}
RUNNER_SHARED = ["__init__.py", "cli.py", "endpoints.py", "inputs.py", "jobs.py", "signals.py"]
RUNNER_PACKAGES = ["api", "batch", "bench", "chains", "commands", "eval", "output", "remote", "runlog", "serve"]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules(root: Path) -> dict[str, Path]:
    """Module name → file, for every Python file of the layered packages under ``root``."""
    out = {}
    for layer in LAYERS + ["configs"]:
        for f in sorted((root / layer).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(["taskrun", *parts])] = f
    top = root / "taskrun" / "__init__.py"  # the package's names (the Python API), above every layer
    if top.exists():
        out["taskrun"] = top
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The taskrun modules that ``name`` imports anywhere in its file (``from X import y`` counts
    as importing X.y when that is a module, else X)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t.startswith("taskrun.") and t != name}
    return out


def graph(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def layer(module: str) -> int:
    if module == "taskrun":
        return len(LAYERS)
    top = module.split(".")[1]
    return LAYERS.index(top) if top in LAYERS else -1  # configs holds data: the bottom


def back_imports(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} imports {t}" for m, ts in g.items() for t in ts if layer(t) > layer(m))


def door(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runner" and parts[2] in DOORS else None


def door_imports(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} imports {t}" for m, ts in g.items() for t in ts if door(m) and door(t) and door(m) != door(t))


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


# --------------------------------------------------------------------------- the rules, on the code


def test_imports_flow_down_the_layers():
    assert back_imports(graph(ROOT)) == []


def test_no_import_cycles():
    assert cycles(graph(ROOT)) == []


def test_the_checks_catch_a_back_import_and_a_cycle(tmp_path):
    """The same checks, on a small tree with one back-import, one ring and one door importing
    another, report each."""
    files = {
        "tasks/__init__.py": "",
        "tasks/base.py": "from taskrun.runner.jobs import run_job\n",  # tasks → runner: up
        "runner/__init__.py": "",
        "runner/jobs.py": "def run_job():\n    from taskrun.runner import cli\n",
        "runner/cli.py": "from taskrun.runner.jobs import run_job\n",  # cli ↔ jobs: a ring
        "runner/serve/__init__.py": "",
        "runner/serve/app.py": "",
        "runner/batch/__init__.py": "",
        "runner/batch/work.py": "def f():\n    from taskrun.runner.serve.app import x\n",  # a door → a door
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    g = graph(tmp_path)
    assert back_imports(g) == ["taskrun.tasks.base imports taskrun.runner.jobs"]
    assert cycles(g) == [["taskrun.runner.cli", "taskrun.runner.jobs"]]
    assert door_imports(g) == ["taskrun.runner.batch.work imports taskrun.runner.serve.app"]


def test_no_door_imports_another_door():
    """batch does not import serve (nor serve batch, nor either the --server client): the request
    and response shapes they share are tasks/wire/."""
    assert door_imports(graph(ROOT)) == []


def test_runner_holds_the_cli_its_shared_modules_and_packages_by_concern():
    runner = ROOT / "runner"
    assert sorted(p.name for p in runner.glob("*.py")) == RUNNER_SHARED
    packages = sorted(p.name for p in runner.iterdir() if (p / "__init__.py").exists())
    assert packages == RUNNER_PACKAGES
    for pkg in packages:  # each package says what it owns
        doc = ast.get_docstring(ast.parse((runner / pkg / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"runner/{pkg}/__init__.py needs a docstring saying what it owns"


def test_the_python_api_is_a_thin_door_and_import_taskrun_loads_nothing():
    g = graph(ROOT)
    used = set().union(*(ts for m, ts in g.items() if m.startswith("taskrun.runner.api")))
    outside = {t for t in used if not t.startswith("taskrun.runner.api")}
    # The job runner, the inputs and the run log, the tasks' contract, and for load() the model
    # resolution and the cache: no pipeline code, no other door, no click.
    assert outside <= {
        "taskrun.runner.jobs",
        "taskrun.runner.inputs",
        "taskrun.runner.runlog.store",
        "taskrun.tasks",
        "taskrun.tasks.base",
        "taskrun.models.resolve",
        "taskrun.pipelines",
    }, sorted(outside)
    # Its names load on first use, inside functions, so `import taskrun` stays cheap
    # (tests/test_python_api.py checks that it loads no other module).
    assert g["taskrun"] <= {"taskrun.runner.api"}


def test_modules_and_functions_stay_small():
    long_modules, long_functions = [], []
    for name, path in modules(ROOT).items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {n} lines")
    assert long_modules == [] and long_functions == []


def test_pipelines_are_family_subpackages():
    flat = sorted(p.name for p in (ROOT / "pipelines").glob("*.py"))
    assert flat == ["__init__.py", "base.py", "device.py"], flat
    families = sorted(p.name for p in (ROOT / "pipelines").iterdir() if (p / "__init__.py").exists())
    assert families == ["diffusion", "llm", "speech", "text", "vision"]


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from the committed-or-not files git tracks, outside the checkout."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\n")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((ROOT / rel).read_bytes())
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    return next(out.glob("taskrun-*.whl"))


def test_the_wheel_installs_one_import_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"taskrun"}


def test_the_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"taskrun/" + str(p.relative_to(ROOT)).removeprefix("taskrun/") for p in modules(ROOT).values()}
    expected |= {
        "taskrun/configs/models.toml",
        "taskrun/configs/chains/meeting-notes.toml",
        "taskrun/pipelines/vision/imagenet_classes.txt",
        "taskrun/pipelines/diffusion/digits-ddpm/unet/diffusion_pytorch_model.safetensors",
    }
    assert expected <= names, sorted(expected - names)


# --------------------------------------------------------------------------- a runtime through the table


class FakeEncoder(TextEncoderEngine):
    """A text-encoder engine with no weights: a text's vector counts its letters a–z."""

    runtime = "fake"

    def __init__(self, card, device, dtype):
        self.device, self.dtype, self.dim, self.max_tokens = "cpu", "float32", 26, 64

    def tokenize(self, texts):
        return [[ord(c) for c in t.lower() if "a" <= c <= "z"] for t in texts]

    def encode_batch(self, ids):
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        for row, seq in enumerate(ids):
            for i in seq:
                out[row, i - ord("a")] += 1
        return out


def test_a_runtime_is_added_through_the_table_alone(tiny_dir, tmp_path, monkeypatch):
    """One engine class and one table row: embed runs on it, and the run log says so. (The model
    offers the runtime through its models.toml entry, which is configuration, not code.)"""
    from click.testing import CliRunner

    from taskrun.pipelines import RUNTIMES, Runtime
    from taskrun.runner.cli import main
    from tests.tiny import models_toml_with
    from tests.tiny.bert import build

    monkeypatch.setitem(
        RUNTIMES,
        ("embed", "fake"),
        Runtime("taskrun.pipelines.text.embed:EmbedPipeline", engine=f"{__name__}:FakeEncoder"),
    )
    aliases = {"tiny-fake": {"local": str(build(tiny_dir)), "runtimes": ["transformers", "fake"]}}
    monkeypatch.setenv("TASKRUN_MODELS_TOML", str(models_toml_with(aliases, tmp_path)))
    r = CliRunner().invoke(
        main,
        ["embed", "abc", "cab", "zzz", "-m", "tiny-fake", "--runtime", "fake", "--json", "-q"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["status"], out["runtime"], out["metrics"]["dim"]) == ("ok", "fake", 26)
    a, b, z = (np.array(it["result"]["vector"]) for it in out["items"])
    assert np.allclose(a, b) and a @ z == 0  # same letters, same vector; none shared, orthogonal
    assert json.loads(CliRunner().invoke(main, ["logs", "show", out["id"]]).stdout)["runtime"] == "fake"
