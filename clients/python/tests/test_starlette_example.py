"""The Starlette example, run in-process against the real pglimit.

httpx's ASGITransport rather than Starlette's TestClient: it runs the app on
the test's own event loop (where the example's AsyncPglimit opens its
connections) and lets the test choose the client address the middleware
reads as the caller's IP.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from conftest import TOKEN, fresh_login

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from starlette_login import create_app  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_login_is_limited_with_forwarded_headers(pglimit_url: str) -> None:
    ids = fresh_login()
    app = create_app(pglimit_url, token=TOKEN)
    transport = httpx.ASGITransport(app=app, client=(ids["ip"], 50000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            statuses = []
            for _ in range(5):
                r = await http.post("/login", json={"email": ids["email"], "password": "x"})
                statuses.append(r.status_code)
                assert r.json() == {"welcome": ids["email"]}
            assert statuses == [200] * 5
            denied = await http.post("/login", json={"email": ids["email"], "password": "x"})
            assert denied.status_code == 429
            assert int(denied.headers["retry-after"]) > 0
            assert denied.headers["ratelimit"].startswith('"email_ip";r=0;')
            assert denied.headers["ratelimit-policy"].startswith('"email_ip";q=5;w=60')
            assert denied.json()["retry_after"] == int(denied.headers["retry-after"])

            # Another route passes untouched; a malformed email is the caller's 400.
            assert (await http.get("/login")).status_code == 405
            bad = await http.post("/login", json={"email": "no-at-sign"})
            assert bad.status_code == 400
