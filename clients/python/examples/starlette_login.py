"""Protect ``POST /login`` with pglimit's ``login`` policy, as ASGI middleware.

Why middleware rather than a call in the handler: the limit then holds for
every route it wraps, before any password hashing is spent, and the handler
stays about logging in. It is plain ASGI (no BaseHTTPMiddleware), so it
works under Starlette, FastAPI or any ASGI server, and streams nothing
twice: it buffers the small login body once and replays it to the app.

Run it:  PGLIMIT_URL=http://127.0.0.1:8080 uvicorn starlette_login:app
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from typing import AsyncIterator, Optional
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pglimit import AsyncPglimit, PglimitProblem, rate_limit_headers

MAX_BODY = 16 * 1024


def _email_of(body: bytes, content_type: str) -> Optional[str]:
    """The ``email`` field of a JSON or form body, if there is one."""
    try:
        if content_type.startswith("application/json"):
            doc = json.loads(body)
            value = doc.get("email") if isinstance(doc, dict) else None
        else:
            values = parse_qs(body.decode()).get("email")
            value = values[0] if values else None
    except ValueError:
        return None
    return value if isinstance(value, str) else None


class LoginRateLimit:
    """ASGI middleware: a ``login`` check (email + client IP) before ``POST path``.

    Denied: 429 with ``RateLimit``, ``RateLimit-Policy`` and ``Retry-After``
    copied from pglimit. A malformed email or IP: 400. pglimit away: what
    the client's ``on_error`` says (here the app fails open).

    The client IP is the ASGI ``client``: behind a proxy, run the server
    with its trusted-proxy option (uvicorn ``--proxy-headers
    --forwarded-allow-ips``) so that this is the caller's, not the proxy's.
    """

    def __init__(self, app: ASGIApp, limiter: AsyncPglimit, path: str = "/login") -> None:
        self.app = app
        self.limiter = limiter
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                await JSONResponse({"error": "body too large"}, 413)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        content_type = Request(scope).headers.get("content-type", "")
        email = _email_of(body, content_type)
        client = scope.get("client")
        if email is None or client is None:
            await JSONResponse({"error": "email required"}, 400)(scope, receive, send)
            return
        try:
            result = await self.limiter.check(
                policy="login", identifiers={"email": email, "ip": client[0]}
            )
        except PglimitProblem as problem:
            await JSONResponse({"error": problem.detail}, 400)(scope, receive, send)
            return
        if not result.allowed:
            response = JSONResponse(
                {"error": "too many login attempts", "retry_after": result.retry_after},
                status_code=429,
                headers=rate_limit_headers(result),
            )
            await response(scope, receive, send)
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def login(request: Request) -> Response:
    """Stands in for the real login: check the password here. After a
    success, ``await limiter.reset(..., buckets=["email_ip"])`` forgives
    the user's earlier typos (see the package README)."""
    doc = await request.json()
    return JSONResponse({"welcome": doc.get("email")})


def create_app(pglimit_url: str, token: Optional[str] = None) -> Starlette:
    """The app, with one pglimit client for its lifetime (closed at shutdown)."""
    limiter = AsyncPglimit(pglimit_url, token=token, timeout=0.5, on_error="allow")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await limiter.close()

    return Starlette(
        routes=[Route("/login", login, methods=["POST"])],
        middleware=[Middleware(LoginRateLimit, limiter=limiter)],
        lifespan=lifespan,
    )


app = create_app(
    os.environ.get("PGLIMIT_URL", "http://127.0.0.1:8080"), os.environ.get("PGLIMIT_TOKEN")
)
