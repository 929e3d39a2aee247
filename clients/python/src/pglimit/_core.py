"""Every request the clients send and every reading of an answer, without I/O.

It exists so that Pglimit and AsyncPglimit share one copy of the protocol
and differ only in how they wait: a :class:`Call` holds the request to send
(method, URL, headers, JSON body, timeout) and the rule that turns what came
back (:meth:`Call.answered` or :meth:`Call.failed`) into a result or one of
the client's exceptions. Nothing here imports an HTTP library.
"""

from __future__ import annotations

import json
from typing import (
    Any, Callable, Dict, Generic, Literal, Mapping, NamedTuple, NoReturn, Optional, TypeVar, Union,
)

from ._body import Window as Window
from ._body import build_body as build_body
from ._body import format_window as format_window
from ._body import window_seconds
from .errors import PglimitProblem, PglimitUnavailable
from .explanation import Explanation, parse_explanation
from .result import CheckResult, Lease, Reason, fallback_result, parse_decision, parse_lease

OnError = Literal["allow", "deny", "raise"]

USER_AGENT = "pglimit-python/0.1.0"
UNKNOWN_LEASE = "urn:pglimit:problem:unknown-lease"

T = TypeVar("T")


class Request(NamedTuple):
    """What to send; the shell passes ``body`` to its HTTP library as JSON."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: Dict[str, Any]
    timeout: float  # seconds, for each phase: connect, write, read, pool wait


class Answer(NamedTuple):
    """What pglimit (or whatever stood in its place) answered."""

    status: int
    reason: str
    headers: Dict[str, str]  # names lowercased
    body: bytes


class Failure(NamedTuple):
    """No answer: the HTTP library's exception, and whether it was a timeout."""

    cause: Exception
    timed_out: bool


Outcome = Union[Answer, Failure]


class Call(Generic[T]):
    """One request, and how to read its outcome; the shell does the I/O between."""

    __slots__ = ("request", "_read")

    def __init__(self, request: Request, read: Callable[[Outcome], T]) -> None:
        self.request = request
        self._read = read

    def answered(self, status: int, reason: str, headers: Mapping[str, str], body: bytes) -> T:
        """Read an answer; ``headers`` may use any case."""
        return self._read(Answer(status, reason, {k.lower(): v for k, v in headers.items()}, body))

    def failed(self, cause: Exception, timed_out: bool) -> T:
        """Read the absence of an answer (``cause`` becomes ``__cause__``)."""
        return self._read(Failure(cause, timed_out))


class Core:
    """Validated constructor arguments, and the call each client method makes."""

    __slots__ = (
        "check_url", "reset_url", "release_url", "renew_url", "explain_url",
        "timeout", "on_error", "headers", "admin_headers",
    )  # fmt: skip

    def __init__(
        self, url: str, token: Optional[str], timeout: float, on_error: str, admin_token: Optional[str] = None
    ) -> None:
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
        self.explain_url = base + "/admin/explain"
        # One number bounds every phase (connect, write, read, pool wait):
        # pglimit answers in a single read, so in practice it bounds the call.
        self.timeout = float(timeout)
        self.on_error: OnError = on_error  # type: ignore[assignment]  # checked above
        self.headers = {"user-agent": USER_AGENT, "accept": "application/json"}
        # Admin calls send the admin token, never the API token (which does not open them).
        self.admin_headers = dict(self.headers)
        if token is not None:
            self.headers["authorization"] = f"Bearer {token}"
        if admin_token is not None:
            self.admin_headers["authorization"] = f"Bearer {admin_token}"

    def _request(
        self,
        url: str,
        body: Dict[str, Any],
        request_id: Optional[str],
        timeout: float,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Request:
        headers = self.headers if headers is None else headers
        if request_id is not None:
            headers = {**headers, "x-request-id": request_id}
        return Request("POST", url, headers, body, timeout)

    def check(
        self, body: Dict[str, Any], request_id: Optional[str], max_wait: Optional[Window] = None
    ) -> Call[CheckResult]:
        """A /check; one pglimit may hold for ``max_wait`` gets that much longer a timeout."""
        timeout = self.timeout if max_wait is None else self.timeout + window_seconds(max_wait)
        return Call(self._request(self.check_url, body, request_id, timeout), self._decision)

    def reset(self, body: Dict[str, Any], request_id: Optional[str]) -> Call[CheckResult]:
        return Call(self._request(self.reset_url, body, request_id, self.timeout), self._decision)

    def release(self, lease_id: str, request_id: Optional[str]) -> Call[bool]:
        request = self._request(self.release_url, {"lease": lease_id}, request_id, self.timeout)
        return Call(request, released)

    def renew(self, lease_id: str, request_id: Optional[str]) -> Call[Lease]:
        request = self._request(self.renew_url, {"lease": lease_id}, request_id, self.timeout)
        return Call(request, renewed)

    def explain(self, body: Dict[str, Any], request_id: Optional[str]) -> Call[Explanation]:
        """A POST /admin/explain of a check's body, with the admin token."""
        request = self._request(self.explain_url, body, request_id, self.timeout, self.admin_headers)
        return Call(request, explained)

    def release_on_exit(self, result: CheckResult) -> Optional[Call[bool]]:
        """The release ``with_lease`` makes on leaving its block, if the check took a lease.

        pglimit unreachable reads as False: the lease then ends by itself,
        and an error here would hide the block's own outcome.
        """
        if result.lease is None:
            return None
        request = self._request(self.release_url, {"lease": result.lease.id}, None, self.timeout)
        return Call(request, _quietly_released)

    def _decision(self, outcome: Outcome) -> CheckResult:
        return decision(self.on_error, outcome)


def _text(answer: Answer) -> str:
    """The body as text, decoded as httpx's ``Response.text`` is: charset, else UTF-8."""
    charset = "utf-8"
    for param in answer.headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.lower() == "charset" and value:
            charset = value.strip("\"'")
    try:
        return answer.body.decode(charset, errors="replace")
    except LookupError:
        return answer.body.decode("utf-8", errors="replace")


def _problem(answer: Answer, request_id: Optional[str]) -> PglimitProblem:
    """The problem document of an error answer, or one made up from its status."""
    try:
        doc = json.loads(answer.body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("type"), str):
        field = doc.get("field")
        return PglimitProblem(
            type=doc["type"],
            status=doc["status"] if isinstance(doc.get("status"), int) else answer.status,
            title=str(doc.get("title", answer.reason)),
            detail=str(doc.get("detail", "")),
            field=field if isinstance(field, str) else None,
            request_id=request_id,
        )
    return PglimitProblem(
        type="about:blank",
        status=answer.status,
        title=answer.reason,
        detail=_text(answer)[:200],
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


def _unanswered(failure: Failure) -> tuple[Reason, str]:
    if failure.timed_out:
        return "timeout", f"pglimit did not answer in time: {failure.cause!r}"
    return "error", f"pglimit could not be reached: {failure.cause!r}"


def decision(on_error: OnError, outcome: Outcome) -> CheckResult:
    """Turn the outcome of a /check or /reset into a result, an exception, or ``on_error``.

    - 200/429 with a Decision body: the decision (a denial is not an error);
    - other 4xx: :class:`PglimitProblem`, always (retrying will not help);
    - a timeout, a connection error, a 5xx, or an answer that is not a
      Decision: ``on_error``.
    """
    if isinstance(outcome, Failure):
        return fail(on_error, *_unanswered(outcome), outcome.cause)
    status = outcome.status
    request_id = outcome.headers.get("x-request-id")
    if 400 <= status < 500 and status != 429:
        raise _problem(outcome, request_id)
    if status >= 500:
        problem = _problem(outcome, request_id)
        return fail(on_error, "error", f"pglimit answered {problem}", None, problem)
    if status not in (200, 429):
        return fail(on_error, "error", f"pglimit answered an unexpected {status}", None)
    try:
        return parse_decision(json.loads(outcome.body), request_id, outcome.headers)
    except (ValueError, KeyError, TypeError) as exc:
        return fail(on_error, "error", f"pglimit's answer ({status}) is not a decision: {exc}", exc)


def answer_body(outcome: Outcome, *, strict: bool) -> Optional[Dict[str, Any]]:
    """The body of a /release, /renew or /admin/explain answer; None for an
    unknown lease unless ``strict``. There is no ``on_error`` here (nothing
    is admitted): pglimit unreachable raises :class:`PglimitUnavailable`, a
    4xx :class:`PglimitProblem`."""
    if isinstance(outcome, Failure):
        _raise(*_unanswered(outcome), outcome.cause, None)
    request_id = outcome.headers.get("x-request-id")
    if outcome.status != 200:
        problem = _problem(outcome, request_id)
        if problem.type == UNKNOWN_LEASE and not strict:
            return None
        if 400 <= outcome.status < 500:
            raise problem
        _raise("error", f"pglimit answered {problem}", None, problem)
    try:
        body = json.loads(outcome.body)
    except ValueError as exc:
        _raise("error", f"pglimit's answer is not JSON: {exc}", exc, None)
    if not isinstance(body, dict):
        _raise("error", "pglimit's answer is not a JSON object", None, None)
    return body


def released(outcome: Outcome) -> bool:
    """Whether a release freed slots (false: released already, ended, or unknown)."""
    body = answer_body(outcome, strict=False)
    return body is not None and body.get("released") is True


def _quietly_released(outcome: Outcome) -> bool:
    try:
        return released(outcome)
    except PglimitUnavailable:
        return False


def renewed(outcome: Outcome) -> Lease:
    """The lease a renewal answers."""
    body = answer_body(outcome, strict=True)
    try:
        return parse_lease(body["lease"] if body is not None else None)
    except (ValueError, KeyError, TypeError) as exc:
        _raise("error", f"pglimit's answer to /renew is not a lease: {exc}", exc, None)


def explained(outcome: Outcome) -> Explanation:
    """The explanation /admin/explain answers (every answer is one, allowed or not)."""
    body = answer_body(outcome, strict=True)
    request_id = outcome.headers.get("x-request-id") if isinstance(outcome, Answer) else None
    try:
        return parse_explanation(body, request_id)
    except (ValueError, KeyError, TypeError) as exc:
        _raise("error", f"pglimit's answer to /admin/explain is not an explanation: {exc}", exc, None)
