"""The synchronous client, for WSGI apps, AWS Lambda and scripts.

Keep one instance per process (at module level in a serverless function):
it holds a pool of keep-alive connections, so checks after the first skip
the TCP handshake, which is most of a check's cost.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import TracebackType
from typing import Iterator, Literal, Mapping, Optional, Sequence, Type, Union, overload

import httpx

from ._core import OnError, Settings, Window, build_body, outcome, released, renewed
from .errors import PglimitUnavailable
from .result import Algorithm, CheckResult, Lease

__all__ = ["Pglimit"]


class Pglimit:
    """A pglimit client (sync). See :class:`pglimit.AsyncPglimit` for asyncio.

    :param url: the service, e.g. ``http://127.0.0.1:8080``.
    :param token: sent as ``Authorization: Bearer <token>`` when given.
    :param timeout: seconds; bounds each phase of a call (connect, send, read).
    :param on_error: what a check answers when pglimit does not (timeout,
        connection error, 5xx): ``"allow"`` (fail open), ``"deny"`` (fail
        closed, ``retry_after=1``) or ``"raise"`` (:class:`PglimitUnavailable`).
        A 4xx problem document always raises :class:`PglimitProblem`.
    :param http_client: an ``httpx.Client`` of your own (proxies, TLS,
        transports); it is not closed by :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        timeout: float = 1.0,
        on_error: OnError = "allow",
        *,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        self._settings = Settings(url, token, timeout, on_error)
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.Client()

    @overload
    def check(
        self,
        *,
        policy: str,
        identifiers: Mapping[str, str],
        cost: int = 1,
        max_wait: Optional[Window] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult: ...

    @overload
    def check(
        self,
        *,
        key: str,
        limit: int,
        window: Window,
        algorithm: Optional[Algorithm] = None,
        cost: int = 1,
        max_wait: Optional[Window] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult: ...

    @overload
    def check(
        self,
        *,
        key: str,
        limit: int,
        algorithm: Literal["concurrency"],
        lease: Window,
        cost: int = 1,
        max_wait: Optional[Window] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult: ...

    def check(
        self,
        *,
        policy: Optional[str] = None,
        identifiers: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        limit: Optional[int] = None,
        window: Optional[Window] = None,
        algorithm: Optional[Algorithm] = None,
        lease: Optional[Window] = None,
        cost: int = 1,
        max_wait: Optional[Window] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult:
        """Check and, if allowed, consume ``cost`` units (all buckets or none).

        With ``max_wait`` (``"2s"`` or a timedelta), a check that would be
        denied is held by pglimit until it is admitted or ``max_wait`` has
        passed; the call's timeout is extended by ``max_wait``.
        """
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=window, algorithm=algorithm, cost=cost, lease=lease, max_wait=max_wait,
        )  # fmt: skip
        return self._post(self._settings.check_url, body, request_id, max_wait)

    @overload
    def peek(
        self, *, policy: str, identifiers: Mapping[str, str], request_id: Optional[str] = None
    ) -> CheckResult: ...

    @overload
    def peek(
        self,
        *,
        key: str,
        limit: int,
        window: Window,
        algorithm: Optional[Algorithm] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult: ...

    @overload
    def peek(
        self,
        *,
        key: str,
        limit: int,
        algorithm: Literal["concurrency"],
        lease: Window,
        request_id: Optional[str] = None,
    ) -> CheckResult: ...

    def peek(
        self,
        *,
        policy: Optional[str] = None,
        identifiers: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        limit: Optional[int] = None,
        window: Optional[Window] = None,
        algorithm: Optional[Algorithm] = None,
        lease: Optional[Window] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult:
        """The state of the buckets, consuming nothing (a check of cost 0)."""
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=window, algorithm=algorithm, cost=0, lease=lease,
        )  # fmt: skip
        return self._post(self._settings.check_url, body, request_id)

    @overload
    def reset(
        self,
        *,
        policy: str,
        identifiers: Mapping[str, str],
        buckets: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult: ...

    @overload
    def reset(
        self,
        *,
        key: str,
        limit: int,
        window: Window,
        algorithm: Optional[Algorithm] = None,
        buckets: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult: ...

    def reset(
        self,
        *,
        policy: Optional[str] = None,
        identifiers: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        limit: Optional[int] = None,
        window: Optional[Window] = None,
        algorithm: Optional[Algorithm] = None,
        buckets: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
    ) -> CheckResult:
        """Put the buckets (all, or those named) back to full, then peek.

        Follows ``on_error`` like a check, so a login that succeeded is not
        failed by pglimit being away; ``reason != "checked"`` then says the
        reset did not happen.
        """
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=window, algorithm=algorithm, cost=0, buckets=buckets,
        )  # fmt: skip
        return self._post(self._settings.reset_url, body, request_id)

    def release(self, lease_id: str, *, request_id: Optional[str] = None) -> bool:
        """Free a lease's slots: True if it held any; False if it was released
        already, has ended, or no longer exists. Raises
        :class:`PglimitUnavailable` if pglimit cannot be reached (the lease
        then ends by itself)."""
        return released(self._lease_call(self._settings.release_url, lease_id, request_id))

    def renew(self, lease_id: str, *, request_id: Optional[str] = None) -> Lease:
        """Extend a lease by its lease time from now. Raises
        :class:`PglimitProblem` (404) if it has ended or was released."""
        return renewed(self._lease_call(self._settings.renew_url, lease_id, request_id))

    @contextmanager
    def with_lease(
        self,
        *,
        policy: Optional[str] = None,
        identifiers: Optional[Mapping[str, str]] = None,
        key: Optional[str] = None,
        limit: Optional[int] = None,
        lease: Optional[Window] = None,
        cost: int = 1,
        request_id: Optional[str] = None,
    ) -> Iterator[CheckResult]:
        """Check a concurrency limit (a policy's, or a key's with ``limit``
        and ``lease``) and hand over the result; on leaving the block the
        lease is released, whether the block returned or raised. Test
        ``result.allowed`` inside. A release pglimit cannot take is left to
        end by itself rather than hide the block's outcome."""
        algorithm: Optional[Algorithm] = "concurrency" if key is not None else None
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=None, algorithm=algorithm, cost=cost, lease=lease,
        )  # fmt: skip
        result = self._post(self._settings.check_url, body, request_id)
        try:
            yield result
        finally:
            if result.lease is not None:
                try:
                    self.release(result.lease.id)
                except PglimitUnavailable:
                    pass

    def _lease_call(
        self, url: str, lease_id: str, request_id: Optional[str]
    ) -> Union[httpx.Response, httpx.HTTPError]:
        s = self._settings
        try:
            return self._http.post(
                url, json={"lease": lease_id}, headers=s.request_headers(request_id), timeout=s.timeout
            )
        except httpx.HTTPError as exc:
            return exc

    def _post(
        self, url: str, body: object, request_id: Optional[str], max_wait: Optional[Window] = None
    ) -> CheckResult:
        s = self._settings
        response: Union[httpx.Response, httpx.HTTPError]
        try:
            response = self._http.post(
                url,
                json=body,
                headers=s.request_headers(request_id),
                timeout=s.timeout_for(max_wait),
            )
        except httpx.HTTPError as exc:
            response = exc
        return outcome(s.on_error, response)

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
