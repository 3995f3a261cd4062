"""One contract, checked against every registered task."""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
from click.testing import CliRunner

from taskrun.pipelines import RUNTIMES
from taskrun.runner.cli import main
from taskrun.tasks import REGISTRY
from taskrun.tasks.base import TaskError, make_options
from tests.tiny import models_toml_with

TOKEN_FIELDS = {"input_tokens", "output_tokens", "ttft_s", "decode_tokens_per_s", "tokens_per_s", "prefill_s"}
TEXT_GENERATION = {"generate", "summarize"}


@pytest.fixture(params=sorted(REGISTRY))
def task(request):
    return REGISTRY[request.param]


def test_options_are_frozen_dataclasses_with_help(task):
    assert dataclasses.is_dataclass(task.Options)
    assert task.Options.__dataclass_params__.frozen
    for f in dataclasses.fields(task.Options):
        assert f.metadata.get("help"), f"{task.name}.Options.{f.name} has no help text"


def test_unknown_option_is_an_error_naming_the_known_ones(task):
    with pytest.raises(TaskError, match="unknown option"):
        make_options(task.Options, {"definitely_not_an_option": 1})


def test_metrics_fields_say_their_scope_and_units(task):
    for f in dataclasses.fields(task.Metrics):
        assert f.metadata.get("scope"), f"{task.name}.Metrics.{f.name} does not say its scope"
        if f.name.endswith(("_s", "_per_s")) or f.name in {"rtf"}:
            assert f.type in ("float", float, "float | None"), f.name


def test_no_task_borrows_token_metrics(task):
    names = {f.name for f in dataclasses.fields(task.Metrics)}
    if task.name not in TEXT_GENERATION and task.name != "embed":
        assert not names & TOKEN_FIELDS, f"{task.name} reports {names & TOKEN_FIELDS}"
    if task.name == "embed":
        assert names & TOKEN_FIELDS == {"input_tokens"}


def test_describe_is_json(task):
    d = task.describe()
    json.dumps(d)
    assert d["takes"] and d["returns"] and d["measures"]


@pytest.fixture(params=sorted(RUNTIMES), ids="{0[0]}-{0[1]}".format)
def row(request):
    return request.param


def test_every_runtime_runs_end_to_end_on_its_tiny_model(row, tiny_dir, tmp_path, monkeypatch):
    """Every (task, runtime) row of the pipelines table has a tiny random model
    (tests/tiny/<task>.py) and runs through the CLI on it."""
    name, runtime = row
    if runtime == "llama.cpp":
        pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (`make install` builds it)")
    task = REGISTRY[name]
    case = importlib.import_module(f"tests.tiny.{name}").case(tiny_dir, runtime)
    if case.aliases:
        monkeypatch.setenv("TASKRUN_MODELS_TOML", str(models_toml_with(case.aliases, tmp_path)))
    args = [name, *case.args, "--model", case.model, "--runtime", runtime, "--json", "-q", *case.options]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["task"] == name and out["status"] == "ok" and out["runtime"] == runtime
    assert out["items"], "no results"
    assert out["model"]["digest"].startswith("sha256:")
    m = out["metrics"]
    assert m["wall_s"] >= m["load_s"] >= 0
    expected = {f.name for f in dataclasses.fields(task.Metrics)}
    assert expected <= set(m), f"missing metrics: {expected - set(m)}"
    log = CliRunner().invoke(main, ["logs", "show", out["id"]])
    assert log.exit_code == 0 and json.loads(log.stdout)["status"] == "ok"


def test_every_task_has_a_runtime():
    assert {task for task, _ in RUNTIMES} == set(REGISTRY)


def test_the_task_suggested_for_each_input_kind_takes_that_kind():
    from taskrun.tasks.base import TASK_FOR_KIND

    for kind, name in TASK_FOR_KIND.items():
        assert kind in REGISTRY[name].input_kinds
