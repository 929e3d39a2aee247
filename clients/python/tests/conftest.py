"""A real pglimit for the whole session, and helpers that run each case on both clients.

The service is started once (a private PostgreSQL takes seconds to
initialise) and always stopped with SIGTERM, so that it stops its cluster:
in the fixture's ``finally``, on SIGTERM to pytest (turned into
KeyboardInterrupt), and, if pytest is killed outright, by the kernel
(``PR_SET_PDEATHSIG``). Every test uses fresh keys and identifiers, so tests
sharing the server cannot see each other's counts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any, AsyncIterator, Callable, Iterator, Literal, Optional

import pytest

from pglimit import AsyncPglimit, CheckResult, Explanation, Lease, Pglimit

HERE = Path(__file__).resolve().parent.parent  # clients/python
TOKEN = "py-client-test-token"
ADMIN_TOKEN = "py-client-test-admin-token"
Kind = Literal["sync", "async"]


def _on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config: pytest.Config) -> None:
    # Python's default for SIGTERM is to die without unwinding: no fixture
    # teardown, so pglimit and its PostgreSQL would be left running.
    signal.signal(signal.SIGTERM, _on_sigterm)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when pytest dies (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _binary() -> Path:
    path = Path(os.environ.get("PGLIMIT_BIN") or HERE / "../../target/debug/pglimit").resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        # One line and exit 1, not the same error under every test.
        pytest.exit(
            f"no pglimit binary at {path}: run `cargo build` in the repository's root, or set PGLIMIT_BIN",
            returncode=1,
        )
    return path


def _listening_addr(log: Path) -> Optional[str]:
    for line in log.read_text(errors="replace").splitlines():
        try:
            fields = json.loads(line).get("fields", {})
        except (ValueError, AttributeError):
            continue
        if isinstance(fields, dict) and fields.get("message") == "listening":
            return str(fields["addr"])
    return None


def _serve(extra_env: dict[str, str]) -> Iterator[str]:
    """Start pglimit with API token TOKEN and ``extra_env``, yield its base URL, stop it."""
    binary = _binary()
    work = Path(tempfile.mkdtemp(prefix="pglimit-py-"))
    work.chmod(0o755)  # as root, the private cluster runs as `postgres`, which must enter it
    log = work / "pglimit.log"
    env = {
        **os.environ,
        "PGLIMIT_DATA_DIR": str(work / "data"),
        "PGLIMIT_BIND": "127.0.0.1:0",
        "PGLIMIT_LOG_FORMAT": "json",
        "PGLIMIT_API_TOKENS": TOKEN,
        **extra_env,
    }
    env.pop("PGLIMIT_POLICIES", None)  # the tests rely on the built-in `login`
    if env.get("DATABASE_URL"):
        env.setdefault("PGLIMIT_KEY_SECRET", secrets.token_hex(32))
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [str(binary)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            preexec_fn=_die_with_parent,
        )
    try:
        deadline = time.monotonic() + 90
        addr = None
        while addr is None:
            addr = _listening_addr(log)
            if addr is not None:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"pglimit did not start (exit {proc.poll()}):\n{log.read_text(errors='replace')}"
                )
            time.sleep(0.05)
        yield f"http://{addr}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def pglimit_url() -> Iterator[str]:
    """Base URL of a pglimit started for this session (API token: TOKEN)."""
    yield from _serve({})


@pytest.fixture(scope="session")
def admin_pglimit_url() -> Iterator[str]:
    """A second pglimit, with admin token ADMIN_TOKEN too, for the admin calls."""
    yield from _serve({"PGLIMIT_ADMIN_TOKENS": ADMIN_TOKEN})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> Kind:
    """Each case runs once with Pglimit and once with AsyncPglimit."""
    return request.param  # type: ignore[no-any-return]


class EitherClient:
    """Pglimit or AsyncPglimit behind one awaitable interface.

    The sync client is called directly (blocking the test's loop, which
    nothing else uses), so both are exercised by the same test body.
    """

    def __init__(self, kind: Kind, url: str, **options: Any) -> None:
        self.kind = kind
        self.sync = Pglimit(url, **options) if kind == "sync" else None
        self.aio = AsyncPglimit(url, **options) if kind == "async" else None

    async def check(self, **kw: Any) -> CheckResult:
        if self.sync is not None:
            return self.sync.check(**kw)
        assert self.aio is not None
        return await self.aio.check(**kw)

    async def peek(self, **kw: Any) -> CheckResult:
        if self.sync is not None:
            return self.sync.peek(**kw)
        assert self.aio is not None
        return await self.aio.peek(**kw)

    async def reset(self, **kw: Any) -> CheckResult:
        if self.sync is not None:
            return self.sync.reset(**kw)
        assert self.aio is not None
        return await self.aio.reset(**kw)

    async def release(self, lease_id: str) -> bool:
        if self.sync is not None:
            return self.sync.release(lease_id)
        assert self.aio is not None
        return await self.aio.release(lease_id)

    async def renew(self, lease_id: str) -> Lease:
        if self.sync is not None:
            return self.sync.renew(lease_id)
        assert self.aio is not None
        return await self.aio.renew(lease_id)

    async def explain(self, **kw: Any) -> Explanation:
        if self.sync is not None:
            return self.sync.explain(**kw)
        assert self.aio is not None
        return await self.aio.explain(**kw)

    async def close(self) -> None:
        if self.sync is not None:
            self.sync.close()
        if self.aio is not None:
            await self.aio.close()


OpenClient = Callable[..., AbstractAsyncContextManager[EitherClient]]


@pytest.fixture
def open_client(kind: Kind) -> OpenClient:
    """``async with open_client(url, **options) as c``: a client of this test's kind."""

    @asynccontextmanager
    async def opener(url: str, **options: Any) -> AsyncIterator[EitherClient]:
        client = EitherClient(kind, url, **options)
        try:
            yield client
        finally:
            await client.close()

    return opener


def fresh_key() -> str:
    return f"py-test:{uuid.uuid4().hex}"


def fresh_login() -> dict[str, str]:
    """Identifiers no other test uses (the `ip` bucket counts across emails)."""
    a, b, c = (secrets.randbelow(256) for _ in range(3))
    return {"email": f"{uuid.uuid4().hex}@example.com", "ip": f"10.{a}.{b}.{c}"}
