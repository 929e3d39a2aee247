"""What ``on_error`` makes of a pglimit that is stopped, silent, or failing."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import httpx
import pytest

from conftest import OpenClient, fresh_key
from pglimit import PglimitUnavailable, rate_limit_headers

pytestmark = pytest.mark.anyio


@pytest.fixture
def closed_port_url() -> str:
    """A loopback port that nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server whose connections are accepted and never answered.

    The kernel completes the handshake for connections in the listen
    backlog, so no thread is needed (and none can be late): the client
    connects, sends, and waits for an answer that never comes.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


class _Failing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps(
            {
                "type": "urn:pglimit:problem:store-unavailable",
                "title": "Service Unavailable",
                "status": 503,
                "detail": "postgres is unavailable",
            }
        ).encode()
        self.send_response(503)
        self.send_header("content-type", "application/problem+json")
        self.send_header("retry-after", "1")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def failing_url() -> Iterator[str]:
    """A stand-in pglimit that answers every check 503 (store-unavailable)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


AD_HOC = {"limit": 5, "window": "1m"}


async def test_stopped_allow(open_client: OpenClient, closed_port_url: str) -> None:
    async with open_client(closed_port_url, on_error="allow") as c:
        r = await c.check(key=fresh_key(), **AD_HOC)
    assert (r.allowed, r.reason, r.store, r.retry_after) == (True, "error", "none", 0)
    assert r.degraded and r.buckets == ()
    assert rate_limit_headers(r) == {}


async def test_stopped_deny(open_client: OpenClient, closed_port_url: str) -> None:
    async with open_client(closed_port_url, on_error="deny") as c:
        r = await c.check(policy="login", identifiers={"email": "a@example.com", "ip": "10.0.0.1"})
    assert (r.allowed, r.reason, r.store, r.retry_after) == (False, "error", "none", 1)
    assert rate_limit_headers(r) == {"Retry-After": "1"}


async def test_stopped_raise(open_client: OpenClient, closed_port_url: str) -> None:
    async with open_client(closed_port_url, on_error="raise") as c:
        with pytest.raises(PglimitUnavailable) as info:
            await c.check(key=fresh_key(), **AD_HOC)
    assert info.value.reason == "error"
    assert isinstance(info.value.__cause__, httpx.ConnectError)


async def test_peek_and_reset_follow_on_error(open_client: OpenClient, closed_port_url: str) -> None:
    async with open_client(closed_port_url, on_error="deny") as c:
        assert (await c.peek(key=fresh_key(), **AD_HOC)).reason == "error"
        r = await c.reset(key=fresh_key(), buckets=["default"], **AD_HOC)
    assert (r.allowed, r.reason) == (False, "error")


@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
async def test_silent_server_times_out(
    open_client: OpenClient, silent_url: str, on_error: str
) -> None:
    reason: str
    async with open_client(silent_url, timeout=0.2, on_error=on_error) as c:
        started = time.perf_counter()
        if on_error == "raise":
            with pytest.raises(PglimitUnavailable) as info:
                await c.check(key=fresh_key(), **AD_HOC)
            reason = info.value.reason
            assert isinstance(info.value.__cause__, httpx.TimeoutException)
        else:
            r = await c.check(key=fresh_key(), **AD_HOC)
            reason = r.reason
            assert r.allowed is (on_error == "allow") and r.store == "none"
        elapsed = time.perf_counter() - started
    assert reason == "timeout"
    assert elapsed < 0.2 + 0.05, f"took {elapsed:.3f} s"


async def test_5xx_is_unavailable(open_client: OpenClient, failing_url: str) -> None:
    async with open_client(failing_url, on_error="allow") as c:
        r = await c.check(key=fresh_key(), **AD_HOC)
    assert (r.allowed, r.reason, r.store) == (True, "error", "none")
    async with open_client(failing_url, on_error="raise") as c:
        with pytest.raises(PglimitUnavailable) as info:
            await c.check(key=fresh_key(), **AD_HOC)
    assert info.value.reason == "error"
    assert info.value.problem is not None
    assert info.value.problem.kind == "store-unavailable" and info.value.problem.status == 503
