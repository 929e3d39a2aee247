"""The headers a caller forwards on its own 429.

pglimit already computed the draft-ietf-httpapi-ratelimit-headers values for
every bucket; recomputing them in the caller would only drift. So this
copies pglimit's headers, and adds ``Retry-After`` whenever the result is a
denial with an end (including an ``on_error="deny"`` fallback, where it is 1).
"""

from __future__ import annotations

from typing import Dict

from .result import CheckResult

__all__ = ["rate_limit_headers"]


def rate_limit_headers(result: CheckResult) -> Dict[str, str]:
    """``RateLimit``, ``RateLimit-Policy`` and ``Retry-After`` for ``result``.

    Only the headers that apply are present: no ``RateLimit*`` when pglimit
    did not answer, no ``Retry-After`` when allowed or deny-listed (a
    deny-list entry has no end, so there is no time to retry after).
    """
    out: Dict[str, str] = {}
    policy = result.headers.get("ratelimit-policy")
    if policy is not None:
        out["RateLimit-Policy"] = policy
    state = result.headers.get("ratelimit")
    if state is not None:
        out["RateLimit"] = state
    if not result.allowed:
        retry = result.headers.get("retry-after")
        if retry is not None:
            out["Retry-After"] = retry
        elif result.retry_after > 0:
            out["Retry-After"] = str(result.retry_after)
    return out
