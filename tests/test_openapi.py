"""Issue 30 item 5: the OpenAPI document at /openapi.json lists the server's routes, and sits
behind the API key when one is set."""

from __future__ import annotations

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
