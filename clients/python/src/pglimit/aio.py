"""The asynchronous client, for ASGI apps (Starlette, FastAPI) and asyncio or trio code.

Keep one instance per event loop (at module level in an ASGI app, closed in
its lifespan): it holds a pool of keep-alive connections, so checks after
the first skip the TCP handshake, which is most of a check's cost. Those
connections belong to the loop that opened them.
"""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, AsyncContextManager, AsyncIterator, Callable, Coroutine, Optional, Type, TypeVar

import httpx

from ._api import ClientMethods
from ._core import Call
from ._httpx import answered, failed
from .explanation import Explanation
from .result import CheckResult, Lease

__all__ = ["AsyncPglimit"]

T = TypeVar("T")
_Co = Coroutine[Any, Any, T]


class AsyncPglimit(
    ClientMethods[
        _Co[CheckResult],
        _Co[bool],
        _Co[Lease],
        AsyncContextManager[CheckResult],
        _Co[Explanation],
        httpx.AsyncClient,
    ]
):
    """A pglimit client (async). See :class:`pglimit.Pglimit` for blocking code.

    Its arguments are described at :meth:`__init__`; ``http_client`` is an
    ``httpx.AsyncClient`` of your own.
    """

    def _new_http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient()

    async def _send(self, call: Call[T]) -> T:
        # The I/O, and nothing else: the core built the request and reads
        # whatever comes back, an httpx exception included.
        r = call.request
        try:
            response = await self._http.request(
                r.method, r.url, json=r.body, headers=r.headers, timeout=r.timeout
            )
        except httpx.HTTPError as exc:
            return failed(call, exc)
        return answered(call, response)

    @asynccontextmanager
    async def _held(self, start: Callable[[], Call[CheckResult]]) -> AsyncIterator[CheckResult]:
        result = await self._send(start())
        try:
            yield result
        finally:
            release = self._core.release_on_exit(result)
            if release is not None:
                await self._send(release)

    async def close(self) -> None:
        """Close the connection pool (unless it was given to the constructor)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncPglimit:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()


def _coroutine_function(name: str) -> Callable[..., _Co[Any]]:
    """The shared method ``name`` as an ``async def`` of AsyncPglimit.

    The shared method already returns a coroutine; wrapping it keeps what an
    ``async def`` gives: ``inspect.iscoroutinefunction`` (and so mocks made
    with ``create_autospec``) says yes, and a bad argument raises at the
    ``await``, not at the call.
    """
    method = getattr(ClientMethods, name)

    @functools.wraps(method)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await method(*args, **kwargs)

    run.__qualname__ = f"AsyncPglimit.{name}"
    return run


for _name in ("check", "peek", "reset", "release", "renew", "explain"):
    setattr(AsyncPglimit, _name, _coroutine_function(_name))
