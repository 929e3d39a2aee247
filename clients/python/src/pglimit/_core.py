"""What the sync and async clients share: everything but the I/O.

Request bodies are built and answers interpreted here, once, so that the two
clients cannot drift apart: each only sends the request and hands the
outcome (a response or an httpx exception) to :func:`outcome`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Dict, Literal, Mapping, NoReturn, Optional, Sequence, Union

import httpx

from .errors import PglimitProblem, PglimitUnavailable
from .result import Algorithm, CheckResult, Lease, Reason, fallback_result, parse_decision, parse_lease

OnError = Literal["allow", "deny", "raise"]
Window = Union[str, timedelta]

USER_AGENT = "pglimit-python/0.1.0"


class Settings:
    """Validated constructor arguments, shared by both clients."""

    __slots__ = ("check_url", "reset_url", "release_url", "renew_url", "timeout", "on_error", "headers")

    def __init__(self, url: str, token: Optional[str], timeout: float, on_error: str) -> None:
        if on_error not in ("allow", "deny", "raise"):
            raise ValueError(f'on_error must be "allow", "deny" or "raise", not {on_error!r}')
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, not {timeout!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {url!r}")
        base = url.rstrip("/")
        self.check_url = base + "/check"
        self.reset_url = base + "/reset"
        self.release_url = base + "/release"
        self.renew_url = base + "/renew"
        # One number bounds every phase (connect, write, read, pool wait):
        # pglimit answers in a single read, so in practice it bounds the call.
        self.timeout = httpx.Timeout(timeout)
        self.on_error: OnError = on_error  # type: ignore[assignment]  # checked above
        self.headers = {"user-agent": USER_AGENT, "accept": "application/json"}
        if token is not None:
            self.headers["authorization"] = f"Bearer {token}"

    def timeout_for(self, max_wait: Optional[Window]) -> httpx.Timeout:
        """The call's timeout: ``max_wait`` longer for a check pglimit may hold."""
        if max_wait is None:
            return self.timeout
        base = self.timeout.read if self.timeout.read is not None else 0.0
        return httpx.Timeout(base + window_seconds(max_wait))

    def request_headers(self, request_id: Optional[str]) -> Dict[str, str]:
        if request_id is None:
            return self.headers
        return {**self.headers, "x-request-id": request_id}


def format_window(window: Window) -> str:
    """A window as pglimit spells it; a timedelta becomes whole ms or s."""
    if isinstance(window, str):
        return window
    ms = round(window.total_seconds() * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def window_seconds(window: Window) -> float:
    """Seconds in a window or ``max_wait`` (``"2s"``, ``"500ms"``, a timedelta).

    Text pglimit would refuse counts as 0 here: the service answers it with
    a 400 naming the field at once, so it needs no longer a timeout.
    """
    if not isinstance(window, str):
        return max(window.total_seconds(), 0.0)
    digits = window.rstrip("mshd")
    unit = window[len(digits):]
    if not digits.isdigit() or unit not in _UNIT_SECONDS:
        return 0.0
    return int(digits) * _UNIT_SECONDS[unit]


def build_body(
    *,
    policy: Optional[str],
    identifiers: Optional[Mapping[str, str]],
    key: Optional[str],
    limit: Optional[int],
    window: Optional[Window],
    algorithm: Optional[Algorithm],
    cost: int,
    buckets: Optional[Sequence[str]] = None,
    lease: Optional[Window] = None,
    max_wait: Optional[Window] = None,
) -> Dict[str, Any]:
    """The JSON body of /check or /reset, for exactly one of the two forms.

    Mixing the forms is a programming error, so it raises TypeError here
    rather than costing a round trip to learn the same from a 400.
    """
    if policy is not None:
        if identifiers is None:
            raise TypeError("policy needs identifiers")
        if key is not None or limit is not None or window is not None or algorithm is not None:
            raise TypeError("give either policy and identifiers, or key, limit and window")
        if lease is not None:
            raise TypeError('lease goes with algorithm="concurrency" on a key')
        body: Dict[str, Any] = {
            "policy": policy,
            "identifiers": dict(identifiers),
            "cost": cost,
        }
    elif key is not None and algorithm == "concurrency":
        if limit is None or lease is None or window is not None:
            raise TypeError('a concurrency key needs limit and lease (e.g. "30s"), not window')
        if identifiers is not None:
            raise TypeError("identifiers go with policy, not key")
        lease_text = format_window(lease)
        body = {"key": key, "limit": limit, "algorithm": algorithm, "lease": lease_text, "cost": cost}
    elif key is not None:
        if lease is not None:
            raise TypeError('lease goes with algorithm="concurrency"')
        if limit is None or window is None:
            raise TypeError("key needs limit and window")
        if identifiers is not None:
            raise TypeError("identifiers go with policy, not key")
        body = {"key": key, "limit": limit, "window": format_window(window), "cost": cost}
        if algorithm is not None:
            body["algorithm"] = algorithm
    else:
        raise TypeError("give either policy and identifiers, or key, limit and window")
    if max_wait is not None:
        body["max_wait"] = format_window(max_wait)
    if buckets is not None:
        if isinstance(buckets, str):
            raise TypeError("buckets is a list of bucket names, not one string")
        body["buckets"] = list(buckets)
    return body


def _problem(response: httpx.Response, request_id: Optional[str]) -> PglimitProblem:
    """The problem document of an error answer, or one made up from its status."""
    try:
        doc = json.loads(response.content)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("type"), str):
        field = doc.get("field")
        return PglimitProblem(
            type=doc["type"],
            status=doc["status"] if isinstance(doc.get("status"), int) else response.status_code,
            title=str(doc.get("title", response.reason_phrase)),
            detail=str(doc.get("detail", "")),
            field=field if isinstance(field, str) else None,
            request_id=request_id,
        )
    return PglimitProblem(
        type="about:blank",
        status=response.status_code,
        title=response.reason_phrase,
        detail=response.text[:200],
        request_id=request_id,
    )


def fail(
    on_error: OnError,
    reason: Reason,
    message: str,
    cause: Optional[BaseException],
    problem: Optional[PglimitProblem] = None,
) -> CheckResult:
    """Apply ``on_error`` to a call that pglimit did not decide."""
    if on_error == "allow":
        return fallback_result(True, reason)
    if on_error == "deny":
        return fallback_result(False, reason)
    _raise(reason, message, cause, problem)


def _raise(
    reason: Reason,
    message: str,
    cause: Optional[BaseException],
    problem: Optional[PglimitProblem],
) -> NoReturn:
    assert reason != "checked"
    raise PglimitUnavailable(reason, message, problem) from cause


def outcome(on_error: OnError, response: Union[httpx.Response, httpx.HTTPError]) -> CheckResult:
    """Turn what the transport gave into a result, an exception, or ``on_error``.

    - 200/429 with a Decision body: the decision (a denial is not an error);
    - other 4xx: :class:`PglimitProblem`, always (retrying will not help);
    - a timeout, a connection error, a 5xx, or an answer that is not a
      Decision: ``on_error``.
    """
    if isinstance(response, httpx.TimeoutException):
        return fail(on_error, "timeout", f"pglimit did not answer in time: {response!r}", response)
    if isinstance(response, httpx.HTTPError):
        return fail(on_error, "error", f"pglimit could not be reached: {response!r}", response)
    status = response.status_code
    request_id = response.headers.get("x-request-id")
    if 400 <= status < 500 and status != 429:
        raise _problem(response, request_id)
    if status >= 500:
        problem = _problem(response, request_id)
        return fail(on_error, "error", f"pglimit answered {problem}", None, problem)
    if status not in (200, 429):
        return fail(on_error, "error", f"pglimit answered an unexpected {status}", None)
    try:
        return parse_decision(json.loads(response.content), request_id, dict(response.headers))
    except (ValueError, KeyError, TypeError) as exc:
        return fail(on_error, "error", f"pglimit's answer ({status}) is not a decision: {exc}", exc)


UNKNOWN_LEASE = "urn:pglimit:problem:unknown-lease"


def lease_answer(
    response: Union[httpx.Response, httpx.HTTPError], *, strict: bool
) -> Optional[Dict[str, Any]]:
    """The body of a /release or /renew answer; None for an unknown lease
    unless ``strict``. There is no ``on_error`` here (nothing is admitted):
    pglimit unreachable raises :class:`PglimitUnavailable`, a 4xx
    :class:`PglimitProblem`."""
    if isinstance(response, httpx.TimeoutException):
        _raise("timeout", f"pglimit did not answer in time: {response!r}", response, None)
    if isinstance(response, httpx.HTTPError):
        _raise("error", f"pglimit could not be reached: {response!r}", response, None)
    request_id = response.headers.get("x-request-id")
    if response.status_code != 200:
        problem = _problem(response, request_id)
        if problem.type == UNKNOWN_LEASE and not strict:
            return None
        if 400 <= response.status_code < 500:
            raise problem
        _raise("error", f"pglimit answered {problem}", None, problem)
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        _raise("error", f"pglimit's answer is not JSON: {exc}", exc, None)
    if not isinstance(body, dict):
        _raise("error", "pglimit's answer is not a JSON object", None, None)
    return body


def released(response: Union[httpx.Response, httpx.HTTPError]) -> bool:
    """Whether a release freed slots (false: released already, ended, or unknown)."""
    body = lease_answer(response, strict=False)
    return body is not None and body.get("released") is True


def renewed(response: Union[httpx.Response, httpx.HTTPError]) -> Lease:
    """The lease a renewal answers."""
    body = lease_answer(response, strict=True)
    try:
        return parse_lease(body["lease"] if body is not None else None)
    except (ValueError, KeyError, TypeError) as exc:
        _raise("error", f"pglimit's answer to /renew is not a lease: {exc}", exc, None)
