"""The synchronous client, for WSGI apps, AWS Lambda and scripts.

Keep one instance per process (at module level in a serverless function):
it holds a pool of keep-alive connections, so checks after the first skip
the TCP handshake, which is most of a check's cost.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import TracebackType
from typing import Callable, ContextManager, Iterator, Optional, Type, TypeVar

import httpx

from ._api import ClientMethods
from ._core import Call
from ._httpx import answered, failed
from .explanation import Explanation
from .result import CheckResult, Lease

__all__ = ["Pglimit"]

T = TypeVar("T")


class Pglimit(
    ClientMethods[CheckResult, bool, Lease, ContextManager[CheckResult], Explanation, httpx.Client]
):
    """A pglimit client (sync). See :class:`pglimit.AsyncPglimit` for asyncio.

    Its arguments are described at :meth:`__init__`; ``http_client`` is an
    ``httpx.Client`` of your own.
    """

    def _new_http(self) -> httpx.Client:
        return httpx.Client()

    def _send(self, call: Call[T]) -> T:
        # The I/O, and nothing else: the core built the request and reads
        # whatever comes back, an httpx exception included.
        r = call.request
        try:
            response = self._http.request(
                r.method, r.url, json=r.body, headers=r.headers, timeout=r.timeout
            )
        except httpx.HTTPError as exc:
            return failed(call, exc)
        return answered(call, response)

    @contextmanager
    def _held(self, start: Callable[[], Call[CheckResult]]) -> Iterator[CheckResult]:
        result = self._send(start())
        try:
            yield result
        finally:
            release = self._core.release_on_exit(result)
            if release is not None:
                self._send(release)

    def close(self) -> None:
        """Close the connection pool (unless it was given to the constructor)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Pglimit:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()
