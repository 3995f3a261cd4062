"""`run serve` on a real default model (marked real): an answer that a random tiny model cannot
give. Whisper tiny.en transcribes real speech through the OpenAI client, as the README shows.
(The language model is left to the README's recorded runs: its first load converts the GGUF,
tens of seconds in a fresh cache.)"""

from __future__ import annotations

import openai
import pytest

from tests.serve_helpers import shipped_server

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def real_server(tmp_path_factory, session_cache):
    with shipped_server(
        tmp_path_factory.mktemp("serve-real"), session_cache, "--preload", "whisper-tiny.en", timeout=180
    ) as server:
        yield server


def test_real_speech_through_the_openai_client(real_server, tiny_dir):
    from tests.tiny.whisper import clip

    client = openai.OpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with open(clip(tiny_dir), "rb") as f:  # "He was not an ill-disposed young man"
        out = client.audio.transcriptions.create(model="whisper-tiny.en", file=f, response_format="verbose_json")
    assert "he was not" in out.text.lower() and "young man" in out.text.lower()
    assert out.segments and out.segments[-1].end <= out.duration + 0.01
