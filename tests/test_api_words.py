"""HTTP errors speak the API's words: a prompt too long is ``code: context_length_exceeded`` (as
OpenAI's), and the fix names request fields, not the CLI's flags (tasks/wire/errors.py); /metrics
says which exposition format it sends, and sends OpenMetrics to a scraper that asks."""

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


def test_metrics_say_their_format_and_speak_openmetrics_when_asked(servers):
    import httpx

    url = servers[0].url + "/metrics"
    plain = httpx.get(url)
    assert plain.status_code == 200 and plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    om = httpx.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.rstrip().endswith("# EOF") and "taskrun_requests" in om.text


def test_serve_on_a_busy_port_says_so_before_serving(tmp_path):
    import socket
    import subprocess

    from tests.serve_helpers import RUN

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [RUN, "serve", "--port", str(port), "--log-db", str(tmp_path / "runs.db")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1 and f"port {port} on 127.0.0.1 is in use" in out.stderr
    assert "serving on" not in out.stderr and "Errno" not in out.stderr


def test_a_remote_cut_names_the_limit_the_user_set(servers):
    import subprocess

    from tests.serve_helpers import RUN

    args = [RUN, "generate", "Why is the sky blue?", "--server", servers[0].url, "--model", "slow-llama"]
    out = subprocess.run([*args, "--max-tokens", "5"], capture_output=True, text=True, timeout=120, env=servers[0].env)
    assert out.returncode == 0, out.stderr
    assert "[cut: stopped at the 5-token limit" in out.stdout + out.stderr
    assert "0-token" not in out.stdout + out.stderr


def test_operator_flags_in_errors_are_run_serve_options():
    """Flags an error leaves as flags (the operator's to set) must be real `run serve` options."""
    import click

    from taskrun.runner.cli import main
    from taskrun.tasks.wire.errors import OPERATOR_FLAGS, public_text

    serve = main.get_command(click.Context(main), "serve")
    options = {o.lstrip("-") for p in serve.params for o in p.opts}
    assert OPERATOR_FLAGS <= options
    assert public_text("ask the operator for --client-runtimes, or lower --max-tokens") == (
        "ask the operator for --client-runtimes, or lower 'max_tokens'"
    )
