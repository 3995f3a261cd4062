"""HTTP errors speak the API's words: a prompt too long is ``code: context_length_exceeded`` (as
OpenAI's), and the fix names request fields, not the CLI's flags (tasks/wire/errors.py)."""

from __future__ import annotations

import openai
import pytest

from taskrun.tasks.base import TaskError
from taskrun.tasks.wire.errors import from_task_error

pytest_plugins = ["tests.serve_helpers"]


def test_the_cli_flags_become_api_fields():
    err = from_task_error(TaskError("it was cut at the 8-token limit before the JSON closed: raise --max-tokens"))
    assert err.message.endswith("raise max_tokens") and err.code is None


def test_a_prompt_too_long_is_context_length_exceeded(servers):
    client = openai.OpenAI(base_url=servers[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "word " * 2000}])
    assert err.value.code == "context_length_exceeded"
    assert "--" not in err.value.message and "max_tokens" in err.value.message
