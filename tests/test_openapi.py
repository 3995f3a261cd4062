"""Issue 30 item 5: the OpenAPI document at /openapi.json lists the server's routes, and sits
behind the API key when one is set."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from taskrun.runner.serve.app import create_app
from taskrun.runner.serve.settings import Settings


def _get(settings: Settings, headers: dict | None = None):
    with TestClient(create_app(settings), raise_server_exceptions=False, base_url="http://localhost") as client:
        return client.get("/openapi.json", headers=headers or {})


def test_openapi_lists_the_openai_and_ollama_routes():
    r = _get(Settings())
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    paths = set(doc["paths"])
    for route in ("/v1/chat/completions", "/v1/embeddings", "/v1/models", "/api/chat", "/api/generate", "/metrics"):
        assert route in paths, f"{route} missing from /openapi.json: {sorted(paths)}"


def test_openapi_needs_the_key_when_one_is_set():
    settings = Settings(api_key="k-123456789")
    assert _get(settings).status_code == 401
    assert _get(settings, {"Authorization": "Bearer k-123456789"}).status_code == 200


def test_ollama_routes_declare_their_request_bodies():
    doc = _get(Settings()).json()
    for route, field in (("/api/chat", "messages"), ("/api/generate", "prompt"), ("/api/embed", "input")):
        schema = doc["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert field in schema["properties"] and "model" in schema["required"]


def test_operation_ids_are_unique():
    doc = _get(Settings()).json()
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values() if "operationId" in op]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


BODY_METHODS = ("post", "put", "patch")


def _request_schema(op: dict) -> tuple[str, dict]:
    (media, content), *_ = op["requestBody"]["content"].items()
    return media, content["schema"]


def test_every_route_that_reads_a_body_declares_its_schema():
    doc = _get(Settings()).json()
    missing = [
        f"{method.upper()} {path}"
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in BODY_METHODS
        and "schema" not in next(iter(op.get("requestBody", {}).get("content", {}).values()), {})
    ]
    assert not missing, f"no request body schema: {missing}"
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        media, schema = _request_schema(doc["paths"][path]["post"])
        assert media == "multipart/form-data" and schema["properties"]["file"]["format"] == "binary"
    _, chat = _request_schema(doc["paths"]["/v1/chat/completions"]["post"])
    assert chat["required"] == ["messages"] and chat["additionalProperties"] is False
    assert chat["properties"]["n"]["enum"] == [1]  # a neutral field, at its neutral value only
    _, native = _request_schema(doc["paths"]["/v1/tasks/{task}"]["post"])
    assert {"input", "options", "model", "stream"} <= set(native["properties"])


def _walk(node, seen: list):
    if isinstance(node, dict):
        if "$ref" in node:
            seen.append(node["$ref"])
        for v in node.values():
            _walk(v, seen)
    elif isinstance(node, list):
        for v in node:
            _walk(v, seen)


def test_the_document_is_valid_openapi_3():
    """openapi-spec-validator where it is installed; a structural check always: the OpenAPI 3
    fields, every $ref resolving, and every schema in it a valid JSON Schema (2020-12, as 3.1 says)."""
    import jsonschema

    doc = _get(Settings()).json()
    assert doc["openapi"].startswith("3.") and doc["info"]["title"] and doc["info"]["version"]
    refs: list[str] = []
    _walk(doc, refs)
    for ref in refs:
        node = doc
        assert ref.startswith("#/"), ref
        for part in ref[2:].split("/"):
            node = node[part]
    for path, item in doc["paths"].items():
        assert path.startswith("/")
        for method, op in item.items():
            assert method in ("get", "put", "post", "delete", "options", "head", "patch", "trace"), method
            assert op["responses"], f"{method} {path} lists no response"
            for param in op.get("parameters", []):
                assert param["in"] in ("path", "query", "header", "cookie") and "schema" in param
            if "requestBody" in op:
                jsonschema.Draft202012Validator.check_schema(_request_schema(op)[1])
    try:
        from openapi_spec_validator import validate
    except ImportError:
        return
    validate(doc)


def _validates(path: str, body: dict) -> bool:
    import jsonschema

    from taskrun.runner.serve.app import create_app

    doc = create_app(Settings()).openapi()
    _, schema = _request_schema(doc["paths"][path]["post"])
    return jsonschema.Draft202012Validator(schema).is_valid(body)


ACCEPTED = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1, "user": "u"}),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stop": ["x"]},
    ),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3, "seed": 7, "logprobs": None}),
    ("/v1/embeddings", {"input": "a note", "encoding_format": "base64"}),
    ("/v1/images/generations", {"prompt": "a seven", "n": 2, "steps": 3, "size": "auto"}),
    ("/v1/responses", {"input": [{"role": "user", "content": "hi"}], "max_output_tokens": 5, "store": False}),
    ("/v1/tasks/{task}", {"input": [{"text": "a"}, "b"], "options": {}, "stream": True}),
    (
        "/api/chat",
        {"model": "m", "messages": [{"role": "user", "content": "hi", "images": []}], "options": {"mirostat": None}},
    ),
]
REFUSED = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": 101}),
    ("/v1/completions", {"prompt": "a", "bogus": 1}),
    ("/v1/embeddings", {"input": "a", "dimensions": 8}),
    ("/v1/images/generations", {"prompt": "a", "n": 11}),
    ("/v1/responses", {"input": "hi", "truncation": "auto"}),
    ("/v1/tasks/{task}", {"input": "a", "bogus": 1}),
    ("/api/generate", {"model": "m", "prompt": "hi", "options": {"mirostat": 2}}),
]


@pytest.mark.parametrize("path, body", ACCEPTED)
def test_what_the_schema_allows_the_parser_takes(path, body):
    assert _validates(path, body)
    _parse(path, body)


@pytest.mark.parametrize("path, body", REFUSED)
def test_what_the_schema_refuses_the_parser_refuses(path, body):
    from taskrun.tasks.wire.errors import APIError

    assert not _validates(path, body)
    with pytest.raises(APIError) as err:
        _parse(path, body)
    assert 400 <= err.value.status < 500


def _parse(path: str, body: dict) -> None:
    """The parser the route runs on ``body`` (it raises APIError where the server answers 4xx)."""
    from taskrun.runner.serve.routes_native import native_spec
    from taskrun.tasks.wire import ollama_api as ol
    from taskrun.tasks.wire import openai_api as oa
    from taskrun.tasks.wire import responses_api as ra
    from taskrun.tasks.wire.jobspec import Uploads

    with Uploads() as uploads:
        if path.startswith("/v1/tasks/"):
            body = dict(body)
            body.pop("stream", None)  # the route takes it off first
            native_spec("embed", body, uploads, {})
        elif path == "/v1/responses":
            oa.job_from_openai(oa.CHAT, ra.read_request(body, ra.ResponseStore()).chat, uploads=uploads)
        elif path == "/api/chat":
            ol.chat_spec(body, uploads)
        elif path == "/api/generate":
            ol.generate_spec(body, uploads)
        else:
            oa.job_from_openai(path, body, uploads=uploads)
