"""Test isolation: no network, a private run log and cache per test session."""

from __future__ import annotations

import os
import sys

import pytest

# Set before anything imports huggingface_hub/transformers: tests never reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load_the_llama_library_a_job_would():
    """Import llama.cpp here as a job does (llamacpp_native.library(): the AVX-512 build where this
    CPU runs it), before any test module's ``importorskip("llama_cpp")`` imports the portable one.
    The tests' in-process jobs and the servers and CLIs they start must run the same kernels: the
    two builds round differently, and on smollm2-135m 2 of 8 greedy answers differed (CI, stop 45).
    A LLAMA_CPP_LIB_PATH this sets is taken back, so each child process chooses for itself."""
    from importlib.util import find_spec

    if find_spec("llama_cpp") is None:
        return
    from taskrun.pipelines.llm.llamacpp_native import library
    from taskrun.tasks.base import TaskError

    before = os.environ.get("LLAMA_CPP_LIB_PATH")
    try:
        library()
    except TaskError:  # e.g. TASKRUN_LLAMA_KERNELS names a level this CPU lacks: the llama.cpp tests say so
        pass
    if before is None:
        os.environ.pop("LLAMA_CPP_LIB_PATH", None)


_load_the_llama_library_a_job_would()


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """A cache dir shared by the whole run: converted weights and digests are made once. Set for
    the whole session, not only per test: module-scoped fixtures resolve models (digests.json)
    before the per-test ``isolated`` runs, and must not write into the user's ~/.cache. The run log
    likewise gets a session default, which ``isolated`` replaces per test."""
    cache, logs = tmp_path_factory.mktemp("taskrun-cache"), tmp_path_factory.mktemp("taskrun-log")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TASKRUN_CACHE_DIR", str(cache))
        mp.setenv("TASKRUN_LOG_DB", str(logs / "runs.db"))
        yield cache


@pytest.fixture(scope="session", autouse=True)
def users_run_log_untouched():
    """No test's job lands in the user's own run log (platformdirs' user data folder). A CliRunner
    env of {"TASKRUN_LOG_DB": None} unsets the test's log, and the jobs went there (two helpers in
    tests/test_endpoint*.py did). Checked by this process's pid, so the user's own jobs meanwhile
    do not count."""
    import sqlite3
    import time
    from contextlib import closing
    from pathlib import Path

    import platformdirs

    path = Path(platformdirs.user_data_dir("taskrun")) / "runs.db"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1))
    yield
    if not path.exists():
        return
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        try:
            rows = db.execute(
                "select id, task from runs where pid = ? and started_at >= ?", (os.getpid(), since)
            ).fetchall()
        except sqlite3.Error:
            return  # not a run log this check can read: not ours to judge
    assert not rows, f"tests wrote {len(rows)} rows into the user's run log {path}: {rows[:5]}"


@pytest.fixture(autouse=True)
def isolated(tmp_path, session_cache, monkeypatch):
    monkeypatch.setenv("TASKRUN_LOG_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("TASKRUN_DEBUG", raising=False)
    monkeypatch.delenv("TASKRUN_SERVER", raising=False)  # a developer's server must not take the tests' jobs
    # Each test runs in its own folder: anything written to "." (images, chain output) lands
    # there, never in the checkout.
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Where tiny random models built in code are saved, once per test run."""
    return tmp_path_factory.mktemp("tiny-models")


# --------------------------------------------------------------------------- tiers


def _weight_packages() -> frozenset[str]:
    """The packages that ship model weights: every package models.toml reads a model from."""
    import tomllib

    from taskrun.models.resolve import CONFIG_DIR

    names = set()
    for entry in tomllib.loads((CONFIG_DIR / "models.toml").read_text())["models"].values():
        refs = [entry.get("package", "")] + list(entry.get("join", [])) + list(entry.get("with", []))
        names |= {ref.partition(":")[0].partition(".")[0] for ref in refs if ref}
    return frozenset(names - {"taskrun"})


class _NoWeights:
    """A finder that makes the weights packages look absent, as on a machine without them."""

    packages = _weight_packages()

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in cls.packages:
            raise ModuleNotFoundError(f"{name} is hidden from the fast tier (mark the test `real`)", name=name)
        return None


@pytest.fixture(autouse=True)
def fast_tier_reads_no_weights(request):
    """The fast tier (-m "not real") must pass where no weights package is installed: its tests
    run with those packages hidden. Tests that need the real weights are marked `real`."""
    if request.node.get_closest_marker("real"):
        yield
        return
    sys.meta_path.insert(0, _NoWeights)
    try:
        yield
    finally:
        sys.meta_path.remove(_NoWeights)
