"""A client for one chat endpoint: OpenAI-compatible (``/v1/chat/completions``, streamed) or
Ollama's native API (``/api/chat``). Torch-free; httpx.

Scopes: ``ttft_s`` and ``total_s`` are measured at this client (request sent → first content
piece received / last byte); ``server`` holds what the endpoint reported (Ollama's
``eval_duration``, ``prompt_eval_duration``, ``load_duration`` in seconds; OpenAI's ``usage``),
kept apart. The API key is read from the environment variable the user names, never from argv;
it is never put in a message, a log row or a result (``safe_url`` drops any userinfo too).
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from taskrun.tasks.base import TaskError

RETRY_STATUS = {429, 500, 502, 503, 504}
_DIGESTS: dict[tuple, str] = {}  # (api, url, model) -> digest, listed once per process


@functools.lru_cache(maxsize=1)
def http_client():
    """The process's one httpx client, shared by every endpoint request: its connections are kept
    alive and reused. A client per request (httpx.post) cost each request a TLS context (~25 ms
    here, even for http://) and a TCP handshake, all inside the client-side TTFT."""
    import httpx

    return httpx.Client()


def safe_url(url: str) -> str:
    """The URL without user:password@ and without a query (where keys sometimes travel)."""
    p = urlsplit(url)
    host = p.hostname or ""
    netloc = host + (f":{p.port}" if p.port else "")
    return urlunsplit((p.scheme, netloc, p.path, "", ""))


def parse_spec(spec: str) -> tuple[str, str, str]:
    """``openai:URL#model`` / ``ollama:URL#model`` / ``URL#model`` → (api, base URL, model). Without a
    prefix, the URL's shape decides: port 11434 or a path ending in /api is Ollama, else OpenAI."""
    api = ""
    for prefix in ("openai:", "ollama:"):
        if spec.startswith(prefix):
            api, spec = prefix[:-1], spec[len(prefix) :]
    url, sep, model = spec.partition("#")
    if not sep or not model or not url.startswith(("http://", "https://")):
        raise TaskError(
            f"endpoint setup {safe_url(url)!r}: give it as openai:http://HOST:PORT/v1#MODEL or ollama:http://HOST:11434#MODEL"
        )
    if not api:
        p = urlsplit(url)
        api = "ollama" if p.port == 11434 or p.path.rstrip("/").endswith("/api") else "openai"
    return api, url.rstrip("/"), model


@dataclass
class Reply:
    text: str = ""
    finish_reason: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None  # at this client: request sent → first content piece received
    total_s: float = 0.0  # at this client: request sent → stream closed
    retries: int = 0  # attempts repeated after a 429, a 5xx, a refused connection or a timeout
    model: str = ""  # the model name the endpoint reported
    digest: str = ""  # where the endpoint gives one (Ollama: /api/show)
    server: dict = field(default_factory=dict)  # what the server reported, in its own scope


@dataclass
class Embeddings:
    vectors: list = field(default_factory=list)  # one list of floats per text, in order
    input_tokens: int = 0  # as the server reported them (0 where it does not)
    total_s: float = 0.0  # at this client: request sent → answer read
    retries: int = 0
    model: str = ""
    digest: str = ""
    server: dict = field(default_factory=dict)


@dataclass
class Endpoint:
    api: str  # openai | ollama
    url: str  # base: http://host:port/v1 (OpenAI) or http://host:11434 (Ollama)
    model: str
    api_key_env: str = ""  # the NAME of the environment variable holding the key
    timeout_s: float = 120.0
    max_retries: int = 2

    @classmethod
    def from_spec(cls, spec: str, api_key_env: str = "", **kw) -> Endpoint:
        api, url, model = parse_spec(spec)
        return cls(api, url, model, api_key_env, **kw)

    @classmethod
    def from_url(cls, url: str, model: str, kind: str = "", api_key_env: str = "", **kw) -> Endpoint:
        """``--endpoint URL --model NAME [--endpoint-kind openai|ollama]``: without a kind, a URL
        whose path ends in /v1 is OpenAI-compatible, anything else Ollama's native API."""
        if not url.startswith(("http://", "https://")):
            raise TaskError(
                f"--endpoint {safe_url(url)!r}: give a URL such as http://127.0.0.1:11434 or https://HOST/v1"
            )
        if "@" in url.split("//", 1)[1].split("/", 1)[0]:
            raise TaskError(
                f"--endpoint {safe_url(url)}: no credentials in the URL; name a variable with --api-key-env VAR"
            )
        if not model:
            raise TaskError(f"--endpoint {safe_url(url)}: name the endpoint's model with --model NAME")
        url = url.rstrip("/")
        api = kind or ("openai" if urlsplit(url).path.endswith("/v1") else "ollama")
        return cls(api, url, model, api_key_env, **kw)

    @property
    def name(self) -> str:
        return f"{self.api}:{safe_url(self.url)}#{self.model}"

    def headers(self) -> dict:
        """The request's Authorization header, the key read from the variable named by --api-key-env."""
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise TaskError(f"--api-key-env {self.api_key_env}: that environment variable is not set; export it")
        return {"Authorization": f"Bearer {key}"}

    def chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        stop: tuple[str, ...] = (),
        on_text=None,
    ) -> Reply:
        """One chat completion, streamed; retried on 429/5xx/refused/timeout up to ``max_retries``."""
        import httpx

        reply = Reply()
        self.retried(reply, lambda: self._stream(httpx, messages, max_tokens, temperature, seed, stop, reply, on_text))
        reply.digest = self.digest(reply.model or self.model)
        return reply

    def embed(self, texts: list[str]) -> Embeddings:
        """Vectors for ``texts`` in one request (OpenAI ``/embeddings``, Ollama ``/api/embed``),
        retried as :meth:`chat` is."""
        out = Embeddings()
        self.retried(out, lambda: self._embed(texts, out))
        out.digest = self.digest(out.model or self.model)
        return out

    def retried(self, reply, once) -> None:
        """``once()``, repeated after a :class:`Retryable` failure up to ``max_retries`` times (counted
        in ``reply.retries``); the last failure becomes a TaskError naming the endpoint."""
        for attempt in range(self.max_retries + 1):
            try:
                return once()
            except Retryable as exc:
                if attempt == self.max_retries:
                    said = f": {exc.said}" if exc.said else ""
                    raise TaskError(f"endpoint {self.name}: {exc} (after {attempt} retries){said}") from None
                reply.retries += 1
                time.sleep(min(0.25 * 2**attempt, 2.0))

    def post(self, path: str, **kw):
        """One POST to ``url + path`` → its response (status below 400). A 429 or 5xx, a refused
        connection or a timeout raise :class:`Retryable` (for :meth:`retried`); another 4xx is a
        TaskError with the server's message, naming the endpoint (never the key)."""
        import httpx

        try:
            r = http_client().post(self.url + path, headers=self.headers(), timeout=self.timeout_s, **kw)
        except httpx.ConnectError:
            raise Retryable("connection refused (is the server running?)") from None
        except httpx.TimeoutException:
            raise Retryable(f"no answer within {self.timeout_s:g} s (timeout)") from None
        except httpx.HTTPError as exc:
            raise Retryable(type(exc).__name__) from None
        if r.status_code in RETRY_STATUS:
            raise Retryable(f"HTTP {r.status_code}", error_text(r.text))
        if r.status_code >= 400:
            raise TaskError(f"endpoint {self.name}: HTTP {r.status_code}: {error_text(r.text)}")
        return r

    def _embed(self, texts: list[str], out: Embeddings) -> None:
        t0 = time.perf_counter()
        r = self.post(
            "/api/embed" if self.api == "ollama" else "/embeddings", json={"model": self.model, "input": texts}
        )
        out.total_s = time.perf_counter() - t0
        try:
            msg = r.json()
            out.model = msg.get("model") or ""
            if self.api == "ollama":
                out.vectors = [list(map(float, v)) for v in msg["embeddings"]]
                out.input_tokens = int(msg.get("prompt_eval_count") or 0)
                for k in ("total_duration", "load_duration"):
                    if msg.get(k) is not None:
                        out.server[k.replace("_duration", "_s")] = msg[k] / 1e9
            else:
                rows = sorted(msg["data"], key=lambda d: d.get("index", 0))
                out.vectors = [list(map(float, d["embedding"])) for d in rows]
                out.server["usage"] = msg.get("usage") or {}
                out.input_tokens = int(out.server["usage"].get("prompt_tokens") or 0)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TaskError(f"endpoint {self.name}: not an embeddings answer: {r.text[:120]!r}") from None
        if len(out.vectors) != len(texts):
            raise TaskError(f"endpoint {self.name}: {len(out.vectors)} vectors for {len(texts)} texts")

    def digest(self, model: str) -> str:
        """The model's digest as the endpoint lists it (Ollama /api/tags, an OpenAI /v1/models entry
        with a ``digest`` field, as `run serve` gives), asked once per endpoint; "" where none."""
        key = (self.api, self.url, model)
        if key not in _DIGESTS:
            import httpx

            path = self.url + ("/api/tags" if self.api == "ollama" else "/models")
            found = ""
            try:
                r = http_client().get(path, headers=self.headers(), timeout=min(self.timeout_s, 10.0))
                rows = r.json().get("models" if self.api == "ollama" else "data") or [] if r.status_code == 200 else []
                for row in rows:
                    if model in (row.get("name"), row.get("model"), row.get("id")) and row.get("digest"):
                        found = str(row["digest"])
                        break
            except (httpx.HTTPError, ValueError, AttributeError):
                pass  # a listing is optional: the run log then holds no digest
            _DIGESTS[key] = found
        return _DIGESTS[key]

    def _stream(self, httpx, messages, max_tokens, temperature, seed, stop, reply, on_text) -> None:
        if self.api == "ollama":
            path = self.url + "/api/chat"
            opts = {
                "num_predict": max_tokens,
                "temperature": temperature,
                **({"seed": seed} if seed is not None else {}),
            }
            body: dict = {"model": self.model, "messages": messages, "stream": True, "options": opts}
            if stop:
                opts["stop"] = list(stop)
        else:
            path = self.url + "/chat/completions"
            body = {
                "model": self.model,
                "messages": messages,
                "stream": True,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "stream_options": {"include_usage": True},
            }
            if seed is not None:
                body["seed"] = seed
            if stop:
                body["stop"] = list(stop)
        t0 = time.perf_counter()
        reply.text, reply.ttft_s = "", None
        try:
            with http_client().stream("POST", path, json=body, headers=self.headers(), timeout=self.timeout_s) as r:
                if r.status_code in RETRY_STATUS:
                    r.read()
                    raise Retryable(f"HTTP {r.status_code}", error_text(r.text))
                if r.status_code >= 400:
                    r.read()
                    raise TaskError(f"endpoint {self.name}: HTTP {r.status_code}: {error_text(r.text)}")
                for line in r.iter_lines():
                    piece = self._line(line, reply)
                    if piece:
                        if reply.ttft_s is None:
                            reply.ttft_s = time.perf_counter() - t0
                        reply.text += piece
                        if on_text:
                            on_text(piece)
        except httpx.ConnectError:
            raise Retryable("connection refused (is the server running?)") from None
        except httpx.TimeoutException:
            raise Retryable(f"no answer within {self.timeout_s:g} s (timeout)") from None
        except httpx.HTTPError as exc:
            raise Retryable(type(exc).__name__) from None
        reply.total_s = time.perf_counter() - t0

    def _line(self, line: str, reply: Reply) -> str:
        line = line.strip()
        if not line:
            return ""
        if self.api == "openai":
            if not line.startswith("data:"):
                return ""
            line = line[5:].strip()
            if line == "[DONE]":
                return ""
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            raise TaskError(f"endpoint {self.name}: a stream line is not JSON: {line[:80]!r}") from None
        if "error" in msg:
            raise TaskError(f"endpoint {self.name}: {error_text(json.dumps(msg))}")
        return _ollama_line(msg, reply) if self.api == "ollama" else _openai_line(msg, reply)


class Retryable(Exception):
    """A failure worth one more try: a 429 or 5xx (``said``: the server's message), a refused
    connection, a timeout."""

    def __init__(self, message: str, said: str = "") -> None:
        super().__init__(message)
        self.said = said


def error_text(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except (ValueError, AttributeError):
        return text[:300]


def _openai_line(msg: dict, reply: Reply) -> str:
    reply.model = msg.get("model") or reply.model
    usage = msg.get("usage")
    if usage:
        reply.server["usage"] = usage
        reply.input_tokens = int(usage.get("prompt_tokens") or 0)
        reply.output_tokens = int(usage.get("completion_tokens") or 0)
    piece = ""
    for ch in msg.get("choices") or []:
        piece += (ch.get("delta") or {}).get("content") or ""
        if ch.get("finish_reason"):
            reply.finish_reason = ch["finish_reason"]
    return piece


def _ollama_line(msg: dict, reply: Reply) -> str:
    reply.model = msg.get("model") or reply.model
    piece = (msg.get("message") or {}).get("content") or ""
    if msg.get("done"):
        reply.finish_reason = msg.get("done_reason") or "stop"
        reply.input_tokens = int(msg.get("prompt_eval_count") or 0)
        reply.output_tokens = int(msg.get("eval_count") or 0)
        for k in ("eval_duration", "prompt_eval_duration", "load_duration", "total_duration"):
            if msg.get(k) is not None:
                reply.server[k.replace("_duration", "_s")] = msg[k] / 1e9
    return piece
