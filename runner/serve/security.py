"""The guard in front of every endpoint: Host and Origin, the API key and the request body limit.

Host and Origin as Ollama checks them (``OLLAMA_ORIGINS``): a web page the user opens may POST
to a local server (a CORS-"simple" request needs no preflight) or reach it through DNS
rebinding (a name of the attacker's that resolves to 127.0.0.1). So a request whose ``Origin``
is not a loopback one (or one the operator allowed with ``--allowed-origins``) is refused 403,
and, on a server bound to loopback, a ``Host`` that is not a loopback name or address, the
bound host or an allowed origin's host is refused 403 too.

A pure ASGI middleware, so both checks happen before any endpoint code runs or any body is
read: a wrong key is refused with 401 before its upload is received, and a body over the limit
is refused from its Content-Length when it declares one, or as soon as the bytes received pass
the limit when it does not (chunked uploads). Keys are compared in constant time
(``hmac.compare_digest``). ``GET /health`` needs no key, so a load balancer can probe it.
Each key is a tenant: the guard puts an opaque id of the key that matched (``tenant_of``) in the
request's scope state, so the prompt cache is shared only within one key (tasks/cache_scope.py).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from taskrun.tasks.wire.errors import APIError

OPEN_PATHS = {"/health"}


class BodyTooLarge(APIError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is over this server's limit of {limit / 1e6:g} MB; send a smaller one",
            code="request_too_large",
        )


def _key_ok(headers: dict[bytes, bytes], key: str) -> bool:
    """The header's bytes against the key's: clients send a non-ASCII key as UTF-8 (httpx,
    curl) or Latin-1 (older ones), so both encodings of the key match."""
    auth = headers.get(b"authorization", b"")
    scheme, _, given = auth.partition(b" ")
    if scheme.lower() != b"bearer":
        given = headers.get(b"x-api-key", b"")
    given = given.strip()
    ok = hmac.compare_digest(given, key.encode("utf-8"))
    try:
        ok |= hmac.compare_digest(given, key.encode("latin-1"))
    except UnicodeEncodeError:
        pass
    return ok


LOOPBACK_ORIGINS = tuple(
    f"{scheme}://{host}{port}"
    for scheme in ("http", "https")
    for host in ("localhost", "127.0.0.1", "[::1]", "0.0.0.0")
    for port in ("", ":*")
) + ("app://*", "file://*", "tauri://*", "vscode-webview://*")


def _host_name(value: str) -> str:
    """``Host`` header → its name or address, without the port."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Origins:
    """Which Origin and Host headers this server answers."""

    def __init__(self, bound: str, allowed: tuple[str, ...] = ()) -> None:
        from taskrun.runner.serve.settings import is_loopback

        self.patterns = LOOPBACK_ORIGINS + tuple(a.strip().lower().rstrip("/") for a in allowed if a.strip())
        self.bound = bound.lower()
        self.check_host = is_loopback(bound)  # a server bound for other machines has a key instead
        self.hosts = {self.bound, f"[{self.bound}]"} | {
            (urlsplit(a).hostname or "").lower() for a in allowed if "://" in a
        }

    def origin_ok(self, origin: str | None) -> bool:
        if origin is None:
            return True  # not a browser: curl, SDKs, scripts
        origin = origin.strip().lower().rstrip("/")
        return any(fnmatch.fnmatchcase(origin, p) for p in self.patterns)

    def host_ok(self, host: str | None) -> bool:
        from taskrun.runner.serve.settings import is_loopback

        if not self.check_host or host is None:
            return True  # HTTP/1.0 without Host: no browser sends one
        name = _host_name(host)
        return is_loopback(name) or name.endswith(".localhost") or name in self.hosts or "*" in self.patterns


def _tenant(key: str) -> str:
    """An id for ``key`` that does not reveal it (it may reach logs or metrics labels)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def tenant_of(scope) -> str:
    """The tenant the guard found for this request ("" on a server without keys)."""
    return (scope.get("state") or {}).get("taskrun_tenant", "")


class Guard:
    """Host and Origin, API key and body limit."""

    def __init__(
        self,
        app,
        *,
        api_key: str | None,
        max_body: int,
        origins: Origins | None = None,
        more_keys: tuple[str, ...] = (),
    ) -> None:
        self.app, self.api_key, self.max_body = app, api_key, max_body
        self.origins = origins or Origins("127.0.0.1")
        self.keys = ((api_key,) if api_key else ()) + tuple(more_keys)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        origin, host = headers.get(b"origin"), headers.get(b"host")
        if not self.origins.origin_ok(origin.decode("latin-1") if origin is not None else None):
            err = APIError(
                403,
                "this server does not answer requests from the web page at Origin "
                f"{origin.decode('latin-1')[:100]}; the server's operator may allow that origin",
                code="origin_not_allowed",
            )
            return await self._refuse(scope, receive, send, err)
        if not self.origins.host_ok(host.decode("latin-1") if host is not None else None):
            err = APIError(
                403,
                f"this server answers on its own address, not Host {host.decode('latin-1')[:100]}: "
                "connect to 127.0.0.1 or localhost (a name resolving here is refused, against DNS rebinding)",
                code="host_not_allowed",
            )
            return await self._refuse(scope, receive, send, err)
        if self.keys and scope["path"] not in OPEN_PATHS:
            matched = [k for k in self.keys if _key_ok(headers, k)]  # every key compared: constant time
            if not matched:
                err = APIError(
                    401, "missing or wrong API key: send the header Authorization: Bearer KEY", code="invalid_api_key"
                )
                return await self._refuse(scope, receive, send, err, {"WWW-Authenticate": "Bearer"})
            scope.setdefault("state", {})["taskrun_tenant"] = _tenant(matched[0])
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            return await self._refuse(scope, receive, send, APIError(400, "bad Content-Length header"))
        if declared > self.max_body:
            return await self._refuse(scope, receive, send, BodyTooLarge(self.max_body), {"Connection": "close"})
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive):
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        return counted

    async def _refuse(self, scope, receive, send, err: APIError, headers: dict | None = None) -> None:
        await JSONResponse(err.body(), status_code=err.status, headers=headers)(scope, receive, send)
