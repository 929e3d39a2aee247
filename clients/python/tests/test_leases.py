"""Concurrency leases against the real pglimit, with both clients:
release, renew, and with_lease releasing on the way out."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from conftest import TOKEN, Kind, OpenClient, fresh_key
from pglimit import AsyncPglimit, Pglimit, PglimitProblem

pytestmark = pytest.mark.anyio


async def test_a_lease_is_renewed_and_released_once(open_client: OpenClient, pglimit_url: str) -> None:
    key = fresh_key()
    async with open_client(pglimit_url, token=TOKEN) as c:
        held = await c.check(key=key, limit=1, algorithm="concurrency", lease="30s")
        assert held.allowed and held.lease is not None
        assert re.fullmatch(r"lease_[0-9a-f]{32}", held.lease.id)
        assert held.lease.expires_at > datetime.now(timezone.utc)
        denied = await c.check(key=key, limit=1, algorithm="concurrency", lease="30s")
        assert not denied.allowed and denied.lease is None
        assert 1 <= denied.retry_after <= 30
        renewed = await c.renew(held.lease.id)
        assert renewed.id == held.lease.id and renewed.expires_at >= held.lease.expires_at
        assert await c.release(held.lease.id) is True
        assert await c.release(held.lease.id) is False
        with pytest.raises(PglimitProblem) as gone:
            await c.renew(held.lease.id)
        assert (gone.value.status, gone.value.field) == (404, "lease")
        again = await c.check(key=key, limit=1, algorithm="concurrency", lease="30s")
        assert again.allowed


class ExportFailed(Exception):
    pass


async def test_with_lease_releases_when_the_block_returns_or_raises(kind: Kind, pglimit_url: str) -> None:
    key = fresh_key()
    check = dict(key=key, limit=1, lease="30s")
    if kind == "sync":
        with Pglimit(pglimit_url, token=TOKEN) as sync:
            with sync.with_lease(key=key, limit=1, lease="30s") as result:
                assert result.allowed and result.lease is not None
                with sync.with_lease(key=key, limit=1, lease="30s") as second:
                    assert not second.allowed
            with pytest.raises(ExportFailed):
                with sync.with_lease(key=key, limit=1, lease="30s") as result:
                    assert result.allowed
                    raise ExportFailed()
            assert sync.check(algorithm="concurrency", **check).allowed  # type: ignore[call-overload]
        return
    async with AsyncPglimit(pglimit_url, token=TOKEN) as aio:
        async with aio.with_lease(key=key, limit=1, lease="30s") as result:
            assert result.allowed and result.lease is not None
            async with aio.with_lease(key=key, limit=1, lease="30s") as second:
                assert not second.allowed
        with pytest.raises(ExportFailed):
            async with aio.with_lease(key=key, limit=1, lease="30s") as result:
                assert result.allowed
                raise ExportFailed()
        assert (await aio.check(algorithm="concurrency", **check)).allowed  # type: ignore[call-overload]


def test_a_concurrency_key_needs_a_lease_and_no_window() -> None:
    client = Pglimit("http://127.0.0.1:9")
    with pytest.raises(TypeError, match="lease"):
        client.check(key="k", limit=1, window="1m", algorithm="concurrency")
    with pytest.raises(TypeError, match="lease"):
        client.check(key="k", limit=1, window="1m", lease="1s")  # type: ignore[call-overload]
    client.close()
