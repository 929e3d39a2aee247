"""Checks, peeks and resets against the real pglimit, with both clients."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from conftest import TOKEN, OpenClient, fresh_key, fresh_login
from pglimit import rate_limit_headers

pytestmark = pytest.mark.anyio


async def test_five_allowed_then_denied(open_client: OpenClient, pglimit_url: str) -> None:
    key = fresh_key()
    async with open_client(pglimit_url, token=TOKEN) as c:
        for expected in (4, 3, 2, 1, 0):
            r = await c.check(key=key, limit=5, window="1m")
            assert (r.allowed, r.remaining, r.limit, r.reason) == (True, expected, 5, "checked")
            assert r.retry_after == 0
            assert r.store == "postgres" and r.degraded is False
            assert "Retry-After" not in rate_limit_headers(r)
        denied = await c.check(key=key, limit=5, window="1m")
    assert denied.allowed is False
    assert denied.reason == "checked"
    assert 0 < denied.retry_after <= 60
    assert denied.request_id
    assert [b.name for b in denied.buckets] == ["default"]
    forwarded = rate_limit_headers(denied)
    assert forwarded["Retry-After"] == str(denied.retry_after)
    assert forwarded["RateLimit"].startswith('"default";r=0;t=')
    assert forwarded["RateLimit-Policy"] == '"default";q=5;w=60'


async def test_peek_consumes_nothing(open_client: OpenClient, pglimit_url: str) -> None:
    key = fresh_key()
    async with open_client(pglimit_url, token=TOKEN) as c:
        first = await c.check(key=key, limit=5, window="1m", algorithm="sliding_log")
        assert first.remaining == 4
        for _ in range(3):
            peeked = await c.peek(key=key, limit=5, window="1m", algorithm="sliding_log")
            assert (peeked.allowed, peeked.remaining) == (True, 4)
        assert (await c.check(key=key, limit=5, window="1m", algorithm="sliding_log")).remaining == 3


async def test_login_answers_per_bucket(open_client: OpenClient, pglimit_url: str) -> None:
    async with open_client(pglimit_url, token=TOKEN) as c:
        r = await c.check(policy="login", identifiers=fresh_login())
    assert [(b.name, b.limit, b.remaining, b.allowed) for b in r.buckets] == [
        ("email_ip", 5, 4, True),
        ("ip", 20, 19, True),
        ("email", 50, 49, True),
    ]
    assert all(b.algorithm == "fixed_window" and not b.blocked for b in r.buckets)
    # The top-level figures are the bucket with least remaining.
    assert (r.limit, r.remaining) == (5, 4)
    now = datetime.now(timezone.utc)
    email = r.bucket("email")
    assert email is not None and email.reset_at.tzinfo is not None
    assert 14 * 60 < (email.reset_at - now).total_seconds() <= 15 * 60 + 1
    assert r.bucket("nope") is None


async def test_reset_brings_email_ip_back(open_client: OpenClient, pglimit_url: str) -> None:
    ids = fresh_login()
    async with open_client(pglimit_url, token=TOKEN) as c:
        for _ in range(5):
            assert (await c.check(policy="login", identifiers=ids)).allowed
        denied = await c.check(policy="login", identifiers=ids)
        assert not denied.allowed
        assert [b.name for b in denied.buckets if not b.allowed] == ["email_ip"]

        after = await c.reset(policy="login", identifiers=ids, buckets=["email_ip"])
        assert after.reason == "checked"
        remaining = {b.name: b.remaining for b in after.buckets}
        assert remaining == {"email_ip": 5, "ip": 15, "email": 45}

        again = await c.check(policy="login", identifiers=ids)
        assert again.allowed and again.bucket("email_ip").remaining == 4  # type: ignore[union-attr]


async def test_token_is_sent_when_configured(open_client: OpenClient, pglimit_url: str) -> None:
    from pglimit import PglimitProblem

    async with open_client(pglimit_url, on_error="allow") as anonymous:
        with pytest.raises(PglimitProblem) as info:
            await anonymous.check(key=fresh_key(), limit=5, window="1m")
    assert info.value.status == 401 and info.value.kind == "unauthorized"
    async with open_client(pglimit_url, token=TOKEN) as c:
        assert (await c.check(key=fresh_key(), limit=5, window="1m")).reason == "checked"


@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
async def test_400_raises_problem_with_field(
    open_client: OpenClient, pglimit_url: str, on_error: str
) -> None:
    from pglimit import PglimitProblem

    async with open_client(pglimit_url, token=TOKEN, on_error=on_error) as c:
        with pytest.raises(PglimitProblem) as info:
            await c.check(policy="login", identifiers={"email": "a@example.com", "ip": "nope"})
    problem = info.value
    assert problem.status == 400
    assert problem.type == "urn:pglimit:problem:invalid-field"
    assert problem.field == "identifiers.ip"
    assert problem.detail and problem.title
    assert problem.request_id


async def test_request_id_is_forwarded(open_client: OpenClient, pglimit_url: str) -> None:
    async with open_client(pglimit_url, token=TOKEN) as c:
        r = await c.check(key=fresh_key(), limit=5, window="1m", request_id="req-42.a")
    assert r.request_id == "req-42.a"
