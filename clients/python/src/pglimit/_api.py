"""The methods both clients offer, written once over the I/O each one does.

It exists so that Pglimit and AsyncPglimit cannot drift apart in what users
see: one copy of every signature, overload and docstring. Each method builds
its call with the sans-I/O core and hands it to the shell's ``_send`` (or
``_held``), whose return type is a type parameter of this class: the value
itself for Pglimit, a coroutine or async context manager for AsyncPglimit.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Literal, Mapping, Optional, Sequence, TypeVar, overload

from ._core import Call, Core, OnError, Window, build_body
from .explanation import Explanation
from .result import Algorithm, CheckResult, Lease

_R = TypeVar("_R")  # what check, peek and reset return
_B = TypeVar("_B")  # what release returns
_L = TypeVar("_L")  # what renew returns
_H = TypeVar("_H")  # what with_lease returns
_E = TypeVar("_E")  # what explain returns
_Http = TypeVar("_Http")  # the httpx client: Client or AsyncClient


class ClientMethods(Generic[_R, _B, _L, _H, _E, _Http]):
    """check, peek, reset, release, renew, with_lease and explain, over ``_send`` and ``_held``."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        timeout: float = 1.0,
        on_error: OnError = "allow",
        *,
        admin_token: Optional[str] = None,
        http_client: Optional[_Http] = None,
    ) -> None:
        """Check the arguments (a ValueError names a bad one); nothing connects yet.

        :param url: the service, e.g. ``http://127.0.0.1:8080``.
        :param token: sent as ``Authorization: Bearer <token>`` when given.
        :param timeout: seconds; bounds each phase of a call (connect, send, read).
        :param on_error: what a check answers when pglimit does not (timeout,
            connection error, 5xx): ``"allow"`` (fail open), ``"deny"`` (fail
            closed, ``retry_after=1``) or ``"raise"`` (:class:`PglimitUnavailable`).
            A 4xx problem document always raises :class:`PglimitProblem`.
        :param admin_token: sent as ``Authorization: Bearer <admin_token>`` by
            the admin calls (:meth:`explain`) in place of ``token``: one of the
            service's ``PGLIMIT_ADMIN_TOKENS`` (API tokens do not open them).
            Without it they send no token, which pglimit accepts only on a
            loopback bind with no tokens configured.
        :param http_client: an ``httpx.Client`` (``httpx.AsyncClient`` for
            :class:`AsyncPglimit`) of your own (proxies, TLS, transports); it
            is not closed by :meth:`close`.
        """
        self._core = Core(url, token, timeout, on_error, admin_token)
        self._owns_http = http_client is None
        self._http: _Http = http_client if http_client is not None else self._new_http()

    @overload
    def check(
        self,
        *,
        policy: str,
        identifiers: Mapping[str, str],
        cost: int = 1,
        max_wait: Optional[Window] = None,
        request_id: Optional[str] = None,
    ) -> _R: ...

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
    ) -> _R: ...

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
    ) -> _R: ...

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
    ) -> _R:
        """Check and, if allowed, consume ``cost`` units (all buckets or none).

        With ``max_wait`` (``"2s"`` or a timedelta), a check that would be
        denied is held by pglimit until it is admitted or ``max_wait`` has
        passed; the call's timeout is extended by ``max_wait``.
        """
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=window, algorithm=algorithm, cost=cost, lease=lease, max_wait=max_wait,
        )  # fmt: skip
        return self._send(self._core.check(body, request_id, max_wait))

    @overload
    def peek(
        self, *, policy: str, identifiers: Mapping[str, str], request_id: Optional[str] = None
    ) -> _R: ...

    @overload
    def peek(
        self,
        *,
        key: str,
        limit: int,
        window: Window,
        algorithm: Optional[Algorithm] = None,
        request_id: Optional[str] = None,
    ) -> _R: ...

    @overload
    def peek(
        self,
        *,
        key: str,
        limit: int,
        algorithm: Literal["concurrency"],
        lease: Window,
        request_id: Optional[str] = None,
    ) -> _R: ...

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
    ) -> _R:
        """The state of the buckets, consuming nothing (a check of cost 0)."""
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=window, algorithm=algorithm, cost=0, lease=lease,
        )  # fmt: skip
        return self._send(self._core.check(body, request_id))

    @overload
    def reset(
        self,
        *,
        policy: str,
        identifiers: Mapping[str, str],
        buckets: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
    ) -> _R: ...

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
    ) -> _R: ...

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
    ) -> _R:
        """Put the buckets (all, or those named) back to full, then peek.

        Follows ``on_error`` like a check, so a login that succeeded is not
        failed by pglimit being away; ``reason != "checked"`` then says the
        reset did not happen.
        """
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=window, algorithm=algorithm, cost=0, buckets=buckets,
        )  # fmt: skip
        return self._send(self._core.reset(body, request_id))

    def release(self, lease_id: str, *, request_id: Optional[str] = None) -> _B:
        """Free a lease's slots: True if it held any; False if it was released
        already, has ended, or no longer exists. Raises
        :class:`PglimitUnavailable` if pglimit cannot be reached (the lease
        then ends by itself)."""
        return self._send(self._core.release(lease_id, request_id))

    def renew(self, lease_id: str, *, request_id: Optional[str] = None) -> _L:
        """Extend a lease by its lease time from now. Raises
        :class:`PglimitProblem` (404) if it has ended or was released."""
        return self._send(self._core.renew(lease_id, request_id))

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
    ) -> _H:
        """Check a concurrency limit (a policy's, or a key's with ``limit``
        and ``lease``) and hand over the result; on leaving the block the
        lease is released, whether the block returned or raised. Test
        ``result.allowed`` inside. A release pglimit cannot take is left to
        end by itself rather than hide the block's outcome."""

        # Built on entering the block, not here, so that a bad argument
        # raises where a generator-based context manager would raise it.
        def start() -> Call[CheckResult]:
            algorithm: Optional[Algorithm] = "concurrency" if key is not None else None
            body = build_body(
                policy=policy, identifiers=identifiers, key=key, limit=limit,
                window=None, algorithm=algorithm, cost=cost, lease=lease,
            )  # fmt: skip
            return self._core.check(body, request_id)

        return self._held(start)

    @overload
    def explain(
        self, *, policy: str, identifiers: Mapping[str, str], cost: int = 1, request_id: Optional[str] = None
    ) -> _E: ...

    @overload
    def explain(
        self,
        *,
        key: str,
        limit: int,
        window: Window,
        algorithm: Optional[Algorithm] = None,
        cost: int = 1,
        request_id: Optional[str] = None,
    ) -> _E: ...

    @overload
    def explain(
        self,
        *,
        key: str,
        limit: int,
        algorithm: Literal["concurrency"],
        lease: Window,
        cost: int = 1,
        request_id: Optional[str] = None,
    ) -> _E: ...

    def explain(
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
        request_id: Optional[str] = None,
    ) -> _E:
        """What ``check`` with the same arguments would answer now, and why,
        counting nothing (``POST /admin/explain``): an :class:`Explanation`,
        allowed or not. An admin call, sent with ``admin_token``; a wrong one
        raises :class:`PglimitProblem` (401), as does a bad argument or an
        unknown policy (400, naming the field). ``on_error`` plays no part:
        pglimit unreachable, too slow or answering 5xx raises
        :class:`PglimitUnavailable`."""
        body = build_body(
            policy=policy, identifiers=identifiers, key=key, limit=limit,
            window=window, algorithm=algorithm, cost=cost, lease=lease,
        )  # fmt: skip
        return self._send(self._core.explain(body, request_id))

    # The shell's I/O: send a call and read its outcome (a value in
    # Pglimit, a coroutine in AsyncPglimit), and hold a lease for a block.

    @overload
    def _send(self, call: Call[CheckResult]) -> _R: ...

    @overload
    def _send(self, call: Call[bool]) -> _B: ...

    @overload
    def _send(self, call: Call[Lease]) -> _L: ...

    @overload
    def _send(self, call: Call[Explanation]) -> _E: ...

    def _send(self, call: Call[Any]) -> Any:
        raise NotImplementedError

    def _held(self, start: Callable[[], Call[CheckResult]]) -> _H:
        raise NotImplementedError

    def _new_http(self) -> _Http:
        """The pool a client makes when it is given none."""
        raise NotImplementedError
