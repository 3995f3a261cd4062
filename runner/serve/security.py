"""The guard in front of every endpoint: the API key and the request body limit.

A pure ASGI middleware, so both checks happen before any endpoint code runs or any body is
read: a wrong key is refused with 401 before its upload is received, and a body over the limit
is refused from its Content-Length when it declares one, or as soon as the bytes received pass
the limit when it does not (chunked uploads). Keys are compared in constant time
(``hmac.compare_digest``). ``GET /health`` needs no key, so a load balancer can probe it.
Each key is a tenant: the guard puts an opaque id of the key that matched (``tenant_of``) in the
request's scope state, so the prompt cache is shared only within one key (tasks/cache_scope.py).
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.responses import JSONResponse

from taskrun.tasks.wire.errors import APIError

OPEN_PATHS = {"/health"}


class BodyTooLarge(APIError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is over this server's limit of {limit / 1e6:g} MB (run serve --max-body-mb)",
            code="request_too_large",
        )


def _given(headers: dict[bytes, bytes]) -> bytes:
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer":
        given = headers.get(b"x-api-key", b"").decode("latin-1")
    return given.strip().encode()


def _key_ok(headers: dict[bytes, bytes], key: str) -> bool:
    return hmac.compare_digest(_given(headers), key.encode())


def _tenant(key: str) -> str:
    """An id for ``key`` that does not reveal it (it may reach logs or metrics labels)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def tenant_of(scope) -> str:
    """The tenant the guard found for this request ("" on a server without keys)."""
    return (scope.get("state") or {}).get("taskrun_tenant", "")


class Guard:
    """API key and body limit."""

    def __init__(self, app, *, api_key: str | None, max_body: int, more_keys: tuple[str, ...] = ()) -> None:
        self.app, self.api_key, self.max_body = app, api_key, max_body
        self.keys = ((api_key,) if api_key else ()) + tuple(more_keys)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
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
