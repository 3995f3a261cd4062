"""Test isolation: no network, a private run log and cache per test session."""

from __future__ import annotations

import os

import pytest

# Set before anything imports huggingface_hub/transformers: tests never reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    """A cache dir shared by the whole run: converted weights and digests are made once."""
    return tmp_path_factory.mktemp("taskrun-cache")


@pytest.fixture(autouse=True)
def isolated(tmp_path, session_cache, monkeypatch):
    monkeypatch.setenv("TASKRUN_LOG_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("TASKRUN_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("TASKRUN_DEBUG", raising=False)
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
