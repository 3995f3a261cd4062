"""The server's batched llama.cpp path against the CLI's on a real 4-bit model (marked real):
smollm2-135m (Q4_1) through a real `run serve` (batching on, its default) and the `openai`
client, against the same prompts run in this process, at temperature 0.

The two read prompts alike (on the float16 prompt copy: pipelines/llm/llamacpp_batch.py), so the
answers are the same text. When the batch read prompts on the 4-bit model, 6 of the 24 eval cases
(samples/eval/cases.jsonl) came back different ("17 + 25 = 32\\n\\nThis is a classic example…"
where the CLI says "17 + 25 = 32.").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import openai
import pytest

from tests.serve_helpers import shipped_server

pytestmark = pytest.mark.real

MODEL = "smollm2-135m"
CASES = Path(__file__).resolve().parent.parent / "samples" / "eval" / "cases.jsonl"


@pytest.fixture(scope="module")
def url(tmp_path_factory, session_cache):
    with shipped_server(
        tmp_path_factory.mktemp("serve-batch-real"), session_cache, "--preload", MODEL, timeout=300
    ) as server:
        yield server.url


def test_served_answers_are_the_clis_at_temperature_0(url):
    import taskrun

    prompts = [json.loads(line)["prompt"] for line in CASES.read_text().splitlines()[:8]]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    served = [
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=48, temperature=0
        )
        .choices[0]
        .message.content
        for p in prompts
    ]
    local = [taskrun.run("generate", p, model=MODEL, max_tokens=48, temperature=0).text for p in prompts]
    assert served == local


def test_run_generate_on_the_endpoint_gives_the_local_text(url, tmp_path):
    import subprocess

    import taskrun
    from tests.serve_helpers import RUN

    prompt = json.loads(CASES.read_text().splitlines()[0])["prompt"]  # "What is 17 + 25? …"
    env = dict(os.environ, TASKRUN_LOG_DB=str(tmp_path / "runs.db"))
    args = ["generate", prompt, "-m", MODEL, "--temperature", "0", "--max-tokens", "48"]
    remote = subprocess.run(
        [RUN, *args, "--endpoint", url + "/v1"], env=env, capture_output=True, text=True, timeout=300
    )
    assert remote.returncode == 0, remote.stderr
    local = taskrun.run("generate", prompt, model=MODEL, max_tokens=48, temperature=0).text
    assert remote.stdout.strip() == local.strip()
