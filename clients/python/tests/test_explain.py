"""explain() against a real pglimit with API and admin tokens, with both
clients: what a check would answer and why (allowed, denied, blocked, each
algorithm's state), counting nothing; the admin token, not the API token,
opens it."""

from __future__ import annotations

import re
import socket
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import httpx
import pytest

from conftest import ADMIN_TOKEN, TOKEN, OpenClient, fresh_key, fresh_login
from pglimit import (
    ConcurrencyState,
    ExplainedBucket,
    Explanation,
    FixedWindowState,
    KeyDenials,
    PglimitProblem,
    PglimitUnavailable,
    SlidingLogState,
    SlidingWindowState,
    TokenBucketState,
)

pytestmark = pytest.mark.anyio


def _bucket(told: Explanation, name: str) -> ExplainedBucket:
    bucket = told.bucket(name)
    assert bucket is not None, f"bucket {name} in {[b.name for b in told.buckets]}"
    return bucket


def _block(url: str, body: dict[str, Any]) -> None:
    """POST /admin/blocks with the admin token: the client has no call for it."""
    answer = httpx.post(f"{url}/admin/blocks", json=body, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert answer.status_code == 200, answer.text


async def test_an_identity_with_room_is_explained_as_allowed_and_nothing_is_counted(
    open_client: OpenClient, admin_pglimit_url: str
) -> None:
    ids = fresh_login()
    async with open_client(admin_pglimit_url, token=TOKEN, admin_token=ADMIN_TOKEN) as c:
        told = await c.explain(policy="login", identifiers=ids)
        assert (told.policy, told.cost, told.allowed, told.reason) == ("login", 1, True, "allowed")
        assert told.why.startswith("Allowed")
        assert (told.rule, told.store, told.degraded, told.shadow) == (None, "postgres", False, False)
        assert told.would_allow is None and told.remembered_denial_until is None
        assert abs((told.checked_at - datetime.now(timezone.utc)).total_seconds()) < 60
        assert told.request_id
        assert [(b.name, b.algorithm, b.limit, b.window, b.remaining, b.state) for b in told.buckets] == [
            ("email_ip", "fixed_window", 5, timedelta(minutes=1), 5, None),
            ("ip", "fixed_window", 20, timedelta(minutes=1), 20, None),
            ("email", "fixed_window", 50, timedelta(minutes=15), 50, None),
        ]
        for b in told.buckets:
            assert re.fullmatch(r"[0-9a-f]{16}", b.key), b.key
            assert (b.allowed, b.retry_after, b.block, b.waiters) == (True, 0, None, 0), b.name
            assert b.reset_at > datetime.now(timezone.utc) and b.why.startswith("room for a cost of 1")
        assert ids["email"] not in repr(told), "the identifiers are never shown"

        assert (await c.check(policy="login", identifiers=ids)).remaining == 4, "explain counted nothing"
        later = await c.explain(policy="login", identifiers=ids)
    state = _bucket(later, "email_ip").state
    assert isinstance(state, FixedWindowState) and state.count == 1
    assert state.window_ends_at > datetime.now(timezone.utc)


async def test_a_login_that_used_up_email_ip_is_explained_as_denied_by_that_bucket(
    open_client: OpenClient, admin_pglimit_url: str
) -> None:
    ids = fresh_login()
    async with open_client(admin_pglimit_url, token=TOKEN, admin_token=ADMIN_TOKEN) as c:
        for _ in range(5):
            assert (await c.check(policy="login", identifiers=ids)).allowed
        told = await c.explain(policy="login", identifiers=ids)
        assert (told.allowed, told.reason) == (False, "denied")
        assert '"email_ip" has no room for a cost of 1' in told.why
        email_ip = _bucket(told, "email_ip")
        assert (email_ip.allowed, email_ip.remaining, email_ip.block) == (False, 0, None)
        assert 1 <= email_ip.retry_after <= 60
        assert isinstance(email_ip.state, FixedWindowState) and email_ip.state.count == 5
        assert (_bucket(told, "ip").allowed, _bucket(told, "ip").remaining) == (True, 15)

        # A denied check is remembered by the instance that denied it, and explain says so.
        assert not (await c.check(policy="login", identifiers=ids)).allowed
        remembered = await c.explain(policy="login", identifiers=ids)
    assert remembered.reason == "denied"
    assert remembered.remembered_denial_until is not None
    assert remembered.remembered_denial_until > datetime.now(timezone.utc)


async def test_a_key_denied_three_times_is_explained_with_three_denials_the_others_with_none(
    open_client: OpenClient, admin_pglimit_url: str
) -> None:
    ids = fresh_login()
    async with open_client(admin_pglimit_url, token=TOKEN, admin_token=ADMIN_TOKEN) as c:
        for _ in range(5):
            assert (await c.check(policy="login", identifiers=ids)).allowed
        for _ in range(3):
            assert not (await c.check(policy="login", identifiers=ids)).allowed
        # The instance that answers writes its own counts before it reads them.
        told = await c.explain(policy="login", identifiers=ids)
    denials = _bucket(told, "email_ip").denials
    assert isinstance(denials, KeyDenials), "the top list is on"
    assert denials.count == 3
    now = datetime.now(timezone.utc)
    assert denials.last is not None and now - timedelta(minutes=5) < denials.last <= now, denials.last
    # Over the retention, 7 days, from the start of its oldest minute.
    back = told.checked_at - timedelta(days=7)
    assert denials.since == back.replace(second=0, microsecond=0), "counted over the retention, 7 days"
    for name in ("ip", "email"):
        other = _bucket(told, name).denials
        assert other is not None and (other.count, other.last) == (0, None), (name, other)


async def test_an_email_an_operator_blocked_is_explained_as_blocked_with_its_reason_and_end(
    open_client: OpenClient, admin_pglimit_url: str
) -> None:
    ids = fresh_login()
    _block(admin_pglimit_url, {"policy": "login", "identifiers": {"email": ids["email"]},
                               "for": "15m", "reason": "ticket 42"})  # fmt: skip
    async with open_client(admin_pglimit_url, token=TOKEN, admin_token=ADMIN_TOKEN) as c:
        told = await c.explain(policy="login", identifiers=ids)
        assert not (await c.check(policy="login", identifiers=ids)).allowed, "check agrees"
    assert (told.allowed, told.reason) == (False, "blocked")
    assert "ticket 42" in told.why
    email = _bucket(told, "email")
    assert email.block is not None
    assert (email.block.kind, email.block.reason, email.allowed, email.remaining) == ("admin", "ticket 42", False, 0)
    now = datetime.now(timezone.utc)
    assert timedelta(minutes=14) < email.block.until - now <= timedelta(minutes=15)
    assert email.block.since <= now + timedelta(seconds=1)
    assert 14 * 60 < email.retry_after <= 15 * 60
    assert (_bucket(told, "email_ip").block, _bucket(told, "ip").block) == (None, None)


async def test_each_algorithms_state_is_told_in_its_own_terms(
    open_client: OpenClient, admin_pglimit_url: str
) -> None:
    now = datetime.now(timezone.utc)
    cases: list[dict[str, Any]] = [
        {"key": fresh_key(), "limit": 3, "window": "1h"},
        {"key": fresh_key(), "limit": 3, "window": "1h", "algorithm": "sliding_window"},
        {"key": fresh_key(), "limit": 3, "window": "1h", "algorithm": "sliding_log"},
        {"key": fresh_key(), "limit": 3, "window": "1h", "algorithm": "token_bucket"},
        {"key": fresh_key(), "limit": 3, "lease": "1h", "algorithm": "concurrency"},
    ]
    async with open_client(admin_pglimit_url, token=TOKEN, admin_token=ADMIN_TOKEN) as c:
        told = []
        for args in cases:
            assert (await c.check(**args)).allowed
            told.append(await c.explain(**args))
    for e in told:
        assert (e.policy, e.reason, len(e.buckets)) == (None, "allowed", 1)
        only = e.buckets[0]
        assert (only.name, only.remaining, only.window) == ("default", 2, timedelta(hours=1))
    fixed, sliding, log, tokens, slots = (e.buckets[0].state for e in told)
    assert isinstance(fixed, FixedWindowState) and fixed.count == 1 and fixed.window_ends_at > now
    assert isinstance(sliding, SlidingWindowState)
    assert (sliding.count, sliding.previous_window_count) == (1, 0) and sliding.window_started_at <= now
    assert isinstance(log, SlidingLogState) and len(log.entries) == 1 and log.entries[0] >= now
    assert isinstance(tokens, TokenBucketState) and tokens.theoretical_arrival_time > now
    assert isinstance(slots, ConcurrencyState) and slots.slots_held == 1 and slots.earliest_lease_end > now


@pytest.mark.parametrize("admin_token", ["wrong", None, TOKEN], ids=["wrong", "missing", "the-api-token"])
async def test_a_wrong_or_missing_admin_token_raises_a_401_problem(
    open_client: OpenClient, admin_pglimit_url: str, admin_token: Optional[str]
) -> None:
    async with open_client(admin_pglimit_url, token=TOKEN, admin_token=admin_token) as c:
        with pytest.raises(PglimitProblem) as info:
            await c.explain(policy="login", identifiers=fresh_login())
        assert (info.value.status, info.value.kind) == (401, "unauthorized")
        assert (await c.check(policy="login", identifiers=fresh_login())).allowed, "the API token still checks"


async def test_an_unknown_policy_or_a_malformed_identifier_raises_a_400_problem_naming_the_field(
    open_client: OpenClient, admin_pglimit_url: str
) -> None:
    async with open_client(admin_pglimit_url, token=TOKEN, admin_token=ADMIN_TOKEN) as c:
        with pytest.raises(PglimitProblem) as unknown:
            await c.explain(policy="nope", identifiers={})
        with pytest.raises(PglimitProblem) as malformed:
            await c.explain(policy="login", identifiers={"email": "a@example.com", "ip": "300.1.1.1"})
    assert (unknown.value.status, unknown.value.kind, unknown.value.field) == (400, "unknown-policy", "policy")
    assert (malformed.value.status, malformed.value.field) == (400, "identifiers.ip")


@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
async def test_an_unreachable_pglimit_raises_unavailable_whatever_on_error_says(
    open_client: OpenClient, on_error: str
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with open_client(url, admin_token=ADMIN_TOKEN, on_error=on_error) as c:
        with pytest.raises(PglimitUnavailable) as info:
            await c.explain(policy="login", identifiers=fresh_login())
    assert info.value.reason == "error"
