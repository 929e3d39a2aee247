"""``max_wait``: pglimit holds a check that would be denied, with both clients."""

from __future__ import annotations

from datetime import timedelta

import pytest

from conftest import TOKEN, OpenClient, fresh_key
from pglimit import PglimitProblem

pytestmark = pytest.mark.anyio

# One token a window: the held check is admitted when it refills.
WINDOW = timedelta(seconds=1)
MAX_WAIT = 3 * WINDOW
# Shorter than the wait: the call's timeout must be extended by max_wait.
TIMEOUT = WINDOW.total_seconds() / 2


async def test_a_held_check_is_admitted_when_the_bucket_refills(
    open_client: OpenClient, pglimit_url: str
) -> None:
    key = fresh_key()
    async with open_client(pglimit_url, token=TOKEN, timeout=TIMEOUT, on_error="raise") as c:
        first = await c.check(key=key, limit=1, window=WINDOW, algorithm="token_bucket")
        assert first.allowed and first.waited_ms is None
        held = await c.check(
            key=key, limit=1, window=WINDOW, algorithm="token_bucket", max_wait="3s"
        )
    assert (held.allowed, held.reason) == (True, "checked")
    assert held.waited_ms is not None
    assert 0 < held.waited_ms <= MAX_WAIT.total_seconds() * 1000


async def test_a_timedelta_max_wait_is_sent_as_pglimit_writes_it(
    open_client: OpenClient, pglimit_url: str
) -> None:
    key = fresh_key()
    async with open_client(pglimit_url, token=TOKEN, timeout=TIMEOUT, on_error="raise") as c:
        await c.check(key=key, limit=1, window="10s", algorithm="token_bucket")
        # The refill is 10 s away, past max_wait: answered at once.
        denied = await c.check(
            key=key, limit=1, window="10s", algorithm="token_bucket", max_wait=MAX_WAIT
        )
    assert (denied.allowed, denied.waited_ms) == (False, 0)


async def test_a_malformed_max_wait_raises_the_problem_naming_it(
    open_client: OpenClient, pglimit_url: str
) -> None:
    async with open_client(pglimit_url, token=TOKEN) as c:
        with pytest.raises(PglimitProblem) as raised:
            await c.check(key=fresh_key(), limit=1, window="1s", max_wait="soon")
    assert (raised.value.status, raised.value.field) == (400, "max_wait")
