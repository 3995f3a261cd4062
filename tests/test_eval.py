"""run eval: the checks, setups, the report's arithmetic, and the endpoint client's errors
(no key in any message). Offline, no weights."""

from __future__ import annotations

import pytest

from taskrun.pipelines.llm.endpoint_client import Endpoint, parse_spec, safe_url
from taskrun.runner.eval import report
from taskrun.runner.eval.attempt import Attempt
from taskrun.runner.eval.cases import Case, check
from taskrun.runner.eval.setups import parse_setup
from taskrun.tasks.base import TaskError


def case(**checks):
    return Case("c", [{"role": "user", "content": "q"}], checks)


@pytest.mark.parametrize(
    ("checks", "answer", "ok"),
    [
        ({"contains": ["a", "b"]}, "a b", True),
        ({"contains": ["a", "z"]}, "a b", False),
        ({"contains": ["a", "z"], "match": "any"}, "a b", True),
        ({"not_contains": "sorry"}, "Sorry, no", False),
        ({"regex": r"^\d+$"}, "42", True),
        ({"equals": "Paris"}, "  paris. ", True),
        ({"number": 3.14, "tolerance": 0.01}, "about 3.141", True),
        ({"number": 1000}, "1,000", True),
        ({"number": 7}, "six", False),
        ({"choices": ["positive", "negative"], "label": "negative"}, "Negative.", True),
        ({"choices": ["positive", "negative"], "label": "negative"}, "positive", False),
        ({"json_schema": {"type": "object", "required": ["a"]}}, 'Here: {"a": 1}', True),
        ({"json_schema": {"type": "object", "required": ["a"]}}, '{"b": 1}', False),
    ],
)
def test_checks(checks, answer, ok):
    assert check(case(**checks), answer)[0] is ok


def test_setups_parse_local_and_endpoint():
    (s,) = parse_setup("smollm2-135m@temperature=0,max_tokens=8,runtime=transformers")
    assert (s.model, s.runtime, s.options) == ("smollm2-135m", "transformers", {"temperature": 0.0, "max_tokens": 8})
    (e,) = parse_setup("ollama:http://127.0.0.1:11434#llama3.2@max_tokens=4")
    assert e.endpoint == "ollama:http://127.0.0.1:11434#llama3.2" and e.options == {"max_tokens": 4}
    assert parse_spec("http://h:11434#m")[0] == "ollama" and parse_spec("http://h:8000/v1#m")[0] == "openai"
    with pytest.raises(TaskError, match="unknown option"):
        parse_setup("smollm2-135m@colour=red")


def test_no_credentials_in_urls_or_errors(monkeypatch):
    assert safe_url("http://user:secret@h:8/v1?key=secret") == "http://h:8/v1"
    with pytest.raises(TaskError) as err:
        parse_setup("openai:http://user:secret-key@127.0.0.1:9/v1#m")
    assert "secret" not in str(err.value)
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    ep = Endpoint.from_spec("openai:http://127.0.0.1:9/v1#m", "MY_KEY", max_retries=1, timeout_s=2)
    with pytest.raises(TaskError) as err:  # nothing listens on port 9: refused, retried once
        ep.chat([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert "127.0.0.1:9" in str(err.value) and "refused" in str(err.value) and "sk-very" not in str(err.value)


def test_report_arithmetic():
    ok1 = Attempt("a", "s", 1, accepted=True, completion_s=1.0, cost=0.2, output_tokens=10, ttft_s=0.1)
    cut = Attempt("b", "s", 1, finish_reason="length", completion_s=2.0, cost=0.4, output_tokens=20, ttft_s=0.2)
    ok2 = Attempt("b", "s", 2, accepted=True, completion_s=1.0, cost=0.2, output_tokens=10, ttft_s=0.3)
    s = report.summarize({"a": [ok1], "b": [cut, ok2]})
    assert (s["accepted"], s["first_try"], s["incomplete"], s["retries"]) == (2, 1, 1, 1)
    assert s["cost_per_accepted"] == pytest.approx(0.4) and s["time_per_accepted_s"] == pytest.approx(2.0)
    assert s["ttft_p50_s"] == 0.2 and s["ttft_p95_s"] == 0.3
    assert "fastest per accepted answer: s" in report.verdict({"s": s}, None)
