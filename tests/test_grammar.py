"""--json-schema by grammar (pipelines/llm/grammar.py): a tiny random Llama writes garbage unless
held to the schema, so every answer below being valid shows the grammar at work; refused schemas
fail before any model loads; an answer that still fails the check fails the job."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from click.testing import CliRunner

from taskrun.runner.cli import main
from taskrun.runner.jobs import run_job
from taskrun.tasks import REGISTRY
from taskrun.tasks import events as ev
from taskrun.tasks.base import Input, TaskError, make_options
from tests.tiny.generate import build

# The server tests' session fixtures (one `run serve` on the tiny models), shared with tests/test_serve.py.
pytest_plugins = ["tests.serve_helpers"]

PETS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 3,
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "kind"],
        "properties": {"name": {"type": "string", "maxLength": 8}, "kind": {"enum": ["cat", "dog", "fish"]}},
    },
}
CODES = {
    "type": "object",
    "additionalProperties": False,
    "required": ["code", "size", "id"],
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "size": {"enum": ["S", "M", "L"]},
        "id": {"oneOf": [{"type": "integer", "maximum": 99}, {"type": "string", "minLength": 2, "maxLength": 4}]},
    },
}


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(build(tiny_dir))


def _schema_file(tmp_path, schema) -> str:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    return str(path)


def _run(tiny, schema_path, **opts):
    task, events = REGISTRY["generate"], []
    rec = run_job(
        task,
        lambda: [Input(source="arg", kind="text", text="List a few pets.")],
        make_options(task.Options, {"json_schema": schema_path, **opts}),
        model=tiny,
        on_event=events.append,
    )
    return rec, events


def test_nested_schema_is_valid_on_every_seed(tiny, tmp_path):
    path = _schema_file(tmp_path, PETS)
    texts = set()
    for seed in range(10):
        rec, events = _run(tiny, path, seed=seed, temperature=1.0, max_tokens=200)
        res = rec.results[0]
        jsonschema.validate(json.loads(res.text), PETS)  # an array of objects, each kind from the enum
        assert res.schema_valid is True and res.json == json.loads(res.text)
        assert res.finish_reason == "stop"  # ended by the grammar (or an allowed end of text), not cut
        assert "".join(e.text for e in events if isinstance(e, ev.Token)) == res.text
        texts.add(res.text)
    assert len(texts) > 5  # the seeds drew different answers: the grammar shapes, the model fills


def test_enum_one_of_string_lengths_and_patterns_hold(tiny, tmp_path):
    path = _schema_file(tmp_path, CODES)
    for seed in range(4):
        res = _run(tiny, path, seed=seed, temperature=1.0, max_tokens=120)[0].results[0]
        value = json.loads(res.text)
        jsonschema.validate(value, CODES)


def test_engine_default_vocabulary_view_also_works(tiny, tmp_path):
    """An engine that does not read its tokens' bytes (the LLMEngine default, from token_texts)
    still decodes valid JSON: the llama.cpp engine may rely on it."""
    from taskrun.models.resolve import resolve
    from taskrun.pipelines.llm.decode import Decoded
    from taskrun.pipelines.llm.engine import LLMEngine
    from taskrun.pipelines.llm.hf_engine import TransformersLLM
    from taskrun.pipelines.llm.sampling import Sampling
    from taskrun.tasks.clock import Clock
    from taskrun.tasks.generate import schema_grammar

    llm = copy.copy(TransformersLLM.load(resolve(tiny), "cpu", "float32"))
    exact, default = llm.token_bytes(), LLMEngine.token_bytes(llm)
    assert len(exact) == len(default) == len(llm.token_texts())
    assert all(d == e for d, e in zip(default, exact) if d)  # whole-character tokens agree
    assert exact[min(llm.eos)].startswith(b"\xff") and default[min(llm.eos)].startswith(b"\xff")
    llm.token_bytes = lambda: LLMEngine.token_bytes(llm)
    s = Sampling(max_tokens=150, temperature=1.0, seed=3, grammar=schema_grammar(PETS))
    out = Decoded()
    text = "".join(llm.stream(llm.prompt_ids("pets"), s, Clock(), out))
    jsonschema.validate(json.loads(text), PETS)
    assert out.finish_reason == "stop"


@pytest.mark.parametrize(
    "schema,named",
    [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, '"not"'),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, '"uniqueItems"'),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, '"if"'),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "$ref"),
        ({"$ref": "https://example.com/schema.json"}, "$ref"),
        (False, "`false`"),
    ],
)
def test_unsupported_schema_is_refused_before_loading(tmp_path, schema, named):
    path = _schema_file(tmp_path, schema)
    r = CliRunner().invoke(main, ["generate", "hi", "--json-schema", path, "--model", "/nonexistent"])
    assert r.exit_code != 0 and named in r.output, r.output
    assert "/nonexistent" not in r.output  # refused on the schema, before the model was looked up


def test_a_failed_check_fails_the_job_with_the_answer_in_the_message(tiny, tmp_path):
    path = _schema_file(tmp_path, PETS)
    r = CliRunner().invoke(
        main, ["generate", "pets", "--json-schema", path, "--model", tiny, "--max-tokens", "4", "--seed", "1"]
    )
    assert r.exit_code != 0, r.output
    assert "does not match --json-schema" in r.output and "raise --max-tokens" in r.output
    assert "The answer began: '[{" in r.output  # what the model wrote, so the failure can be seen
    with pytest.raises(TaskError, match="4-token limit"):
        _run(tiny, path, max_tokens=4)
    from taskrun.runner.runlog.store import RunLog

    assert RunLog().recent(1)[0]["status"] == "failed"


def test_nested_schema_on_the_llama_cpp_engine(tiny_dir, tmp_path):
    """The same grammar on llama.cpp's engine: its token_bytes come from llama_token_to_piece."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (`make install` builds it)")
    from tests.tiny import gguf_llama

    gguf = str(gguf_llama.build(tiny_dir))
    path = _schema_file(tmp_path, PETS)
    for seed in range(3):
        rec, _ = _run(gguf, path, seed=seed, temperature=1.0, max_tokens=200)
        assert rec.runtime == "llama.cpp"
        jsonschema.validate(json.loads(rec.results[0].text), PETS)


def test_server_response_format_uses_the_same_grammar(servers):
    import openai

    client = openai.OpenAI(base_url=servers[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)
    fmt = {"type": "json_schema", "json_schema": {"name": "pets", "schema": PETS}}
    for seed in range(3):
        chat = client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "List a few pets."}],
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            response_format=fmt,
        )
        jsonschema.validate(json.loads(chat.choices[0].message.content), PETS)
        assert chat.choices[0].finish_reason == "stop"
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}
    with pytest.raises(openai.BadRequestError, match='"not"'):
        client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=5, response_format=bad
        )
