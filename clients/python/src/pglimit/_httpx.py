"""How the shells hand what httpx gave them to the core, written once.

Both clients use httpx, so which of its exceptions count as a timeout and
which response fields the core reads is the same for both; only the waiting
(``await`` or not) is theirs.
"""

from __future__ import annotations

from typing import TypeVar

import httpx

from ._core import Call

T = TypeVar("T")


def answered(call: Call[T], response: httpx.Response) -> T:
    """Read a response (any status) as the call's outcome."""
    return call.answered(response.status_code, response.reason_phrase, response.headers, response.content)


def failed(call: Call[T], exc: httpx.HTTPError) -> T:
    """Read httpx's exception (no answer, or none in time) as the call's outcome."""
    return call.failed(exc, timed_out=isinstance(exc, httpx.TimeoutException))
