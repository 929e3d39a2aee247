"""pglimit: one shared, exact rate limit kept in PostgreSQL, behind ``POST /check``.

    from pglimit import Pglimit
    limiter = Pglimit("http://127.0.0.1:8080", on_error="allow")
    result = limiter.check(policy="login", identifiers={"email": email, "ip": ip})
    if not result.allowed:
        return 429, rate_limit_headers(result)
"""

from ._core import OnError, Window
from .aio import AsyncPglimit
from .client import Pglimit
from .errors import PglimitError, PglimitProblem, PglimitUnavailable
from .explanation import (
    Block,
    BucketState,
    ConcurrencyState,
    ExplainedBucket,
    ExplainReason,
    Explanation,
    FixedWindowState,
    KeyDenials,
    SlidingLogState,
    SlidingWindowState,
    TokenBucketState,
)
from .headers import rate_limit_headers
from .result import Algorithm, BucketResult, CheckResult, Lease, Override, Reason, Store

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "AsyncPglimit",
    "Block",
    "BucketResult",
    "BucketState",
    "CheckResult",
    "ConcurrencyState",
    "ExplainReason",
    "ExplainedBucket",
    "Explanation",
    "FixedWindowState",
    "KeyDenials",
    "Lease",
    "OnError",
    "Override",
    "Pglimit",
    "PglimitError",
    "PglimitProblem",
    "PglimitUnavailable",
    "Reason",
    "SlidingLogState",
    "SlidingWindowState",
    "Store",
    "TokenBucketState",
    "Window",
    "rate_limit_headers",
]
