"""The sans-I/O core and the two shells over it, without a pglimit: requests
built, answers read, and both clients sending the same bytes for the same call."""

from __future__ import annotations

import asyncio
import inspect
import json
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional

import httpx
import pytest

from pglimit import AsyncPglimit, CheckResult, Lease, Pglimit, PglimitProblem, PglimitUnavailable
from pglimit._core import Core, OnError

DECISION = {"allowed": True, "limit": 5, "remaining": 4, "reset_at": "2026-11-29T15:17:53.942Z",
            "retry_after_s": None, "store": "postgres", "degraded": False, "buckets": []}  # fmt: skip
STORE_DOWN = {"type": "urn:pglimit:problem:store-unavailable", "title": "Service Unavailable",
              "status": 503, "detail": "postgres is unavailable"}  # fmt: skip
UNKNOWN_LEASE = {"type": "urn:pglimit:problem:unknown-lease", "title": "Not Found", "status": 404,
                 "detail": "no such lease", "field": "lease"}  # fmt: skip
KEY_BODY: Dict[str, Any] = {"key": "k", "limit": 5, "window": "1m", "cost": 1}


def core(on_error: OnError = "allow") -> Core:
    return Core("http://pglimit:8080/", "s3cret", 0.5, on_error)


def check(
    on_error: OnError, status: int, doc: object, headers: Optional[Dict[str, str]] = None
) -> CheckResult:
    body = json.dumps(doc).encode()
    return core(on_error).check(KEY_BODY, None).answered(status, "Reason", headers or {}, body)


def test_a_check_request_carries_the_token_the_request_id_and_a_longer_timeout_for_max_wait() -> None:
    request = core().check(KEY_BODY, "req-1", max_wait="2s").request
    assert (request.method, request.url, request.body) == ("POST", "http://pglimit:8080/check", KEY_BODY)
    assert request.headers == {"user-agent": "pglimit-python/0.1.0", "accept": "application/json",
                               "authorization": "Bearer s3cret", "x-request-id": "req-1"}  # fmt: skip
    assert request.timeout == 2.5
    assert core().reset(KEY_BODY, None).request.url == "http://pglimit:8080/reset"
    assert core().release("lease_1", None).request.body == {"lease": "lease_1"}
    assert "x-request-id" not in core().renew("lease_1", None).request.headers


def test_a_decision_keeps_every_header_lowercased() -> None:
    r = check("raise", 429, {**DECISION, "allowed": False, "remaining": 0, "retry_after_s": 7},
              {"X-Request-Id": "abc", "RateLimit": '"default";r=0;t=7'})  # fmt: skip
    assert (r.allowed, r.retry_after, r.reason, r.request_id) == (False, 7, "checked", "abc")
    assert r.headers == {"x-request-id": "abc", "ratelimit": '"default";r=0;t=7'}


@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
def test_a_4xx_raises_whatever_on_error_says(on_error: OnError) -> None:
    with pytest.raises(PglimitProblem) as info:
        check(on_error, 400, {"type": "urn:pglimit:problem:invalid-field", "title": "Bad Request",
                              "status": 400, "detail": "not an IP", "field": "identifiers.ip"})  # fmt: skip
    assert (info.value.kind, info.value.field) == ("invalid-field", "identifiers.ip")


def test_a_4xx_that_is_no_problem_document_is_about_blank_with_its_text() -> None:
    page = "<h1>Zugriff verweigert – Größe</h1>".encode("latin-1", errors="replace")
    call = core().check(KEY_BODY, None)
    with pytest.raises(PglimitProblem) as info:
        call.answered(403, "Forbidden", {"Content-Type": "text/html; charset=ISO-8859-1"}, page)
    assert (info.value.type, info.value.status, info.value.title) == ("about:blank", 403, "Forbidden")
    assert info.value.detail == page.decode("latin-1")


def test_a_5xx_follows_on_error_and_keeps_the_problem() -> None:
    allowed = check("allow", 503, STORE_DOWN)
    assert (allowed.allowed, allowed.reason, allowed.store, allowed.degraded) == (True, "error", "none", True)
    assert (check("deny", 503, STORE_DOWN).allowed, check("deny", 503, STORE_DOWN).retry_after) == (False, 1)
    with pytest.raises(PglimitUnavailable) as info:
        check("raise", 503, STORE_DOWN)
    assert info.value.problem is not None and info.value.problem.kind == "store-unavailable"


def test_no_answer_or_a_garbled_one_follows_on_error() -> None:
    cause = httpx.ReadTimeout("slow")
    assert core("allow").check(KEY_BODY, None).failed(cause, timed_out=True).reason == "timeout"
    with pytest.raises(PglimitUnavailable) as info:
        core("raise").check(KEY_BODY, None).failed(cause, timed_out=True)
    assert info.value.reason == "timeout" and info.value.__cause__ is cause
    assert check("deny", 200, {"allowed": True}).reason == "error"
    assert check("allow", 302, DECISION).reason == "error"


def test_lease_answers() -> None:
    c = core("allow")
    assert c.release("l", None).answered(200, "OK", {}, b'{"released": true}') is True
    assert c.release("l", None).answered(404, "Not Found", {}, json.dumps(UNKNOWN_LEASE).encode()) is False
    with pytest.raises(PglimitProblem):
        c.renew("l", None).answered(404, "Not Found", {}, json.dumps(UNKNOWN_LEASE).encode())
    with pytest.raises(PglimitUnavailable):  # on_error does not apply to leases
        c.release("l", None).failed(httpx.ConnectError("refused"), timed_out=False)
    lease = {"lease": {"id": "lease_1", "expires_at": "2026-11-29T15:17:53Z"}}
    renewed = c.renew("l", None).answered(200, "OK", {}, json.dumps(lease).encode())
    assert renewed == Lease("lease_1", datetime(2026, 11, 29, 15, 17, 53, tzinfo=timezone.utc))


def test_with_lease_releases_quietly_and_only_a_lease() -> None:
    held = check("raise", 200, {**DECISION, "lease": {"id": "lease_1", "expires_at": DECISION["reset_at"]}})
    release = core().release_on_exit(held)
    assert release is not None and release.request.body == {"lease": "lease_1"}
    assert release.failed(httpx.ConnectError("refused"), timed_out=False) is False
    assert core().release_on_exit(check("raise", 200, DECISION)) is None


def test_an_explain_carries_the_admin_token_not_the_api_token_and_raises_on_any_failure() -> None:
    admin = Core("http://pglimit:8080/", "s3cret", 0.5, "allow", admin_token="adm1n")
    request = admin.explain(KEY_BODY, "req-1").request
    assert (request.url, request.body, request.timeout) == ("http://pglimit:8080/admin/explain", KEY_BODY, 0.5)
    assert request.headers == {"user-agent": "pglimit-python/0.1.0", "accept": "application/json",
                               "authorization": "Bearer adm1n", "x-request-id": "req-1"}  # fmt: skip
    assert "authorization" not in core().explain(KEY_BODY, None).request.headers, "no admin token, none sent"
    assert core().check(KEY_BODY, None).request.headers["authorization"] == "Bearer s3cret"
    with pytest.raises(PglimitUnavailable):  # on_error does not apply to explain
        admin.explain(KEY_BODY, None).failed(httpx.ConnectError("refused"), timed_out=False)
    with pytest.raises(PglimitUnavailable) as garbled:
        admin.explain(KEY_BODY, None).answered(200, "OK", {}, json.dumps(DECISION).encode())
    assert "not an explanation" in str(garbled.value)
    with pytest.raises(PglimitUnavailable) as down:
        admin.explain(KEY_BODY, None).answered(503, "Service Unavailable", {}, json.dumps(STORE_DOWN).encode())
    assert down.value.problem is not None and down.value.problem.kind == "store-unavailable"


PUBLIC = ["check", "peek", "reset", "release", "renew", "with_lease", "explain"]


def test_both_clients_offer_the_same_methods_and_the_async_ones_are_coroutine_functions() -> None:
    for name in PUBLIC:
        sync, aio = getattr(Pglimit, name), getattr(AsyncPglimit, name)
        assert inspect.signature(sync).parameters == inspect.signature(aio).parameters, name
        assert sync.__doc__ == aio.__doc__ and sync.__doc__, name
        assert not inspect.iscoroutinefunction(sync)
        assert inspect.iscoroutinefunction(aio) is (name != "with_lease"), name


def test_both_shells_send_the_same_request_and_read_the_same_result() -> None:
    seen: List[httpx.Request] = []

    def pglimit(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=DECISION, headers={"x-request-id": "r"})

    args = dict(key="k", limit=5, window="1m", request_id="r")
    with httpx.Client(transport=httpx.MockTransport(pglimit)) as http:
        s = Pglimit("http://pglimit", "t", http_client=http)
        from_sync = s.check(**args)  # type: ignore[call-overload]

    async def run_async() -> CheckResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(pglimit)) as http:
            a = AsyncPglimit("http://pglimit", "t", http_client=http)
            result: CheckResult = await a.check(**args)  # type: ignore[call-overload]
        return result

    from_async = asyncio.run(run_async())
    assert from_sync == from_async and from_sync.headers == from_async.headers
    sent_sync, sent_async = seen
    for part in ("method", "url", "content"):
        assert getattr(sent_sync, part) == getattr(sent_async, part), part
    assert dict(sent_sync.headers) == dict(sent_async.headers)
    assert sent_sync.extensions["timeout"] == sent_async.extensions["timeout"]
