"""The in-process model cache: one load per key under concurrency, LRU order, the memory budget,
sizes measured from what was loaded, and the --max-memory size parser."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
import torch

from taskrun.models.sizes import format_size, parse_size
from taskrun.pipelines import (
    cache_info,
    cached_model,
    clear_cache,
    memory_budget,
    set_memory_budget,
)
from taskrun.tasks.base import ModelCard, TaskError

MB = 10**6


@pytest.fixture(autouse=True)
def fresh_cache():
    clear_cache()
    set_memory_budget(None)
    yield
    clear_cache()
    set_memory_budget(None)


def card(name: str, size_bytes: int = 0) -> ModelCard:
    return ModelCard(
        name=name,
        path=f"/models/{name}",
        architecture="Fake",
        tasks=("embed",),
        runtime="torch",
        runtimes=("torch",),
        size_bytes=size_bytes,
        digest=f"sha256:{name}",
        source="test",
    )


class Engine:
    """Holds its torch module as an attribute, as the engines do."""

    def __init__(self, megabytes: int) -> None:
        self.model = torch.nn.Linear(megabytes * MB // 4, 1, bias=False)  # float32: 4 bytes a weight
        self.config = {"name": "x"}


class Blob:
    """An entry that holds no torch modules (CTranslate2, a tokenizer)."""


def load(name: str, megabytes: int = 1, role: str = "model", size_bytes: int = 0):
    return cached_model(card(name, size_bytes), "torch", "cpu", "float32", role, lambda: Engine(megabytes))


def loaded() -> list[str]:
    return [e["model"] for e in cache_info()]


def test_one_load_for_concurrent_callers_of_one_model():
    calls = []
    started = threading.Event()

    def slow_factory():
        calls.append(1)
        started.set()
        time.sleep(0.3)  # long enough for the second caller to arrive during the load
        return Blob()

    results = []

    def job():
        results.append(cached_model(card("m"), "torch", "cpu", "float32", "model", slow_factory))

    threads = [threading.Thread(target=job) for _ in range(2)]
    threads[0].start()
    started.wait(5)
    threads[1].start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1
    assert len(results) == 2 and results[0] is results[1]


def test_loads_run_one_at_a_time_and_warm_models_never_wait():
    """Model B's load waits for model A's (transformers and diffusers switch process-wide state
    while building a model: two loads in two threads break each other), while a model already
    loaded is served at once, A's load still under way."""
    cached_model(card("warm"), "torch", "cpu", "float32", "m", Blob)
    a_started, a_release, b_started = threading.Event(), threading.Event(), threading.Event()

    def slow_a():
        a_started.set()
        assert a_release.wait(10)
        return Blob()

    def b():
        b_started.set()
        return Blob()

    ta = threading.Thread(target=lambda: cached_model(card("a"), "torch", "cpu", "float32", "m", slow_a))
    ta.start()
    assert a_started.wait(5)
    tb = threading.Thread(target=lambda: cached_model(card("b"), "torch", "cpu", "float32", "m", b))
    tb.start()
    warm = cached_model(card("warm"), "torch", "cpu", "float32", "m", lambda: pytest.fail("reloaded"))
    assert warm is not None
    assert not b_started.wait(0.3), "B's load started while A's was under way"
    a_release.set()
    ta.join(10)
    tb.join(10)
    assert b_started.is_set() and sorted(loaded()) == ["a", "b", "warm"]


def test_a_failed_load_is_not_cached_and_is_retried():
    def broken():
        raise RuntimeError("disk error")

    with pytest.raises(RuntimeError):
        cached_model(card("m"), "torch", "cpu", "float32", "model", broken)
    assert loaded() == []
    assert isinstance(cached_model(card("m"), "torch", "cpu", "float32", "model", Blob), Blob)


def test_sizes_come_from_torch_modules_or_the_card():
    load("torchy", megabytes=2, size_bytes=999)
    cached_model(card("ct2", 5 * MB), "ctranslate2", "cpu", "int8", "engine", Blob)
    cached_model(card("torchy", 999), "torch", "cpu", "float32", "tokenizer", Blob)
    info = {(e["model"], e["role"]): e for e in cache_info()}
    assert info[("torchy", "model")]["bytes"] == 2 * MB  # measured, not the card's 999
    assert info[("ct2", "engine")]["bytes"] == 5 * MB  # no torch modules: the card's size
    assert info[("torchy", "tokenizer")]["bytes"] == 0  # a second role of a loaded model
    assert set(info[("ct2", "engine")]) == {
        "model",
        "digest",
        "runtime",
        "device",
        "dtype",
        "role",
        "bytes",
        "last_used",
    }


def test_budget_unloads_least_recently_used_first():
    set_memory_budget(int(3.5 * MB))
    load("a")
    load("b")
    load("c")
    load("a")  # a is now the most recently used; b is the oldest
    load("d")
    assert loaded() == ["c", "a", "d"]
    load("e", megabytes=2)  # needs two of the three out: c, then a
    assert loaded() == ["d", "e"]


def test_evicted_models_are_released():
    set_memory_budget(int(1.5 * MB))
    ref = weakref.ref(load("a"))
    load("b")
    gc.collect()
    assert ref() is None
    assert loaded() == ["b"]


def test_lowering_the_budget_unloads_at_once():
    for name in "abc":
        load(name)
    set_memory_budget(2 * MB)
    assert loaded() == ["b", "c"]
    assert memory_budget() == 2 * MB
    with pytest.raises(ValueError):
        set_memory_budget(0)


def test_a_model_larger_than_the_budget_still_loads_alone():
    set_memory_budget(2 * MB)
    load("small")
    engine = load("big", megabytes=3)
    assert isinstance(engine, Engine)
    assert loaded() == ["big"]


def test_card_size_makes_room_before_the_load():
    """With the card's size known, older models are unloaded before the new weights are read."""
    set_memory_budget(2 * MB)
    load("a")
    load("b")
    seen = []

    def factory():
        seen.append(loaded())
        return Blob()

    cached_model(card("c", 2 * MB), "ctranslate2", "cpu", "int8", "engine", factory)
    assert seen == [[]]
    assert loaded() == ["c"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4GB", 4 * 10**9),
        ("4GiB", 4 * 2**30),
        ("4g", 4 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5 GB", 1_500_000_000),
        ("100", 100),
        (2048, 2048),
        ("2kib", 2048),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "4 parsecs", "GB", "-1GB", "0"])
def test_parse_size_refuses_with_an_example(text):
    with pytest.raises(TaskError, match="--max-memory"):
        parse_size(text, "--max-memory")


def test_format_size():
    assert format_size(1_500_000_000) == "1.5 GB"
    assert format_size(512) == "512 B"


def test_a_budget_below_every_model_is_refused_naming_the_least(monkeypatch):
    """Issue 33 item 15a: `run serve --max-memory 1MB` was accepted and every model loaded anyway."""
    from click.testing import CliRunner

    from taskrun.runner.cli import main
    from taskrun.runner.commands import serve

    monkeypatch.setattr(serve, "smallest_model", lambda: ("tiny-one", 1_990_986))
    for stub in ("_run", "_set_threads", "_set_budget"):  # a budget that fits: the server would start
        monkeypatch.setattr(serve, stub, lambda *a: None)
    r = CliRunner().invoke(main, ["serve", "--max-memory", "1MB"])
    assert r.exit_code == 2, r.output
    assert "below the size of every model here; the smallest, tiny-one, takes 2.0 MB" in r.output
    assert "give at least --max-memory 2MB" in r.output
    r = CliRunner().invoke(main, ["serve", "--max-memory", "2MB"])
    assert r.exit_code == 0, r.output
    assert parse_size("2MB") >= 1_990_986


@pytest.mark.real
def test_a_one_byte_budget_is_refused_with_the_installed_models():
    from click.testing import CliRunner

    from taskrun.models.resolve import aliases
    from taskrun.runner.cli import main

    r = CliRunner().invoke(main, ["serve", "--max-memory", "1"])
    assert r.exit_code == 2 and "below the size of every model here" in r.output, r.output
    assert any(f"the smallest, {name}, takes" in r.output for name in aliases()), r.output
