"""The answer of a check, as immutable values.

Frozen dataclasses rather than dicts so that a result can be passed around
(logged, cached, compared) without anyone changing it, and so that type
checkers see every field. Parsing lives here too, next to the shape it fills.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Literal, Mapping, Optional, Tuple

__all__ = [
    "Algorithm",
    "BucketResult",
    "CheckResult",
    "Lease",
    "Override",
    "Reason",
    "Store",
]

Reason = Literal["checked", "timeout", "error"]
Store = Literal["postgres", "memory", "none"]
Algorithm = Literal["fixed_window", "sliding_window", "sliding_log", "token_bucket", "concurrency"]
OverrideAction = Literal["limits", "unlimited", "deny"]


@dataclass(frozen=True)
class BucketResult:
    """One bucket of a check (an ad hoc key's one bucket is ``default``)."""

    name: str
    algorithm: Algorithm
    allowed: bool
    limit: int
    remaining: int
    reset_at: datetime
    blocked: bool = False


@dataclass(frozen=True)
class Override:
    """Which override matched, and what it did: ``index`` of the policy
    file's ``[[overrides]]`` entry, or ``id`` of one set through the API
    (``/admin/overrides``); the other is ``None``."""

    index: Optional[int]
    action: OverrideAction
    id: Optional[str] = None


@dataclass(frozen=True)
class Lease:
    """The slots an admitted check of a concurrency bucket holds.

    Free them with ``release(lease.id)`` (or use ``with_lease``); unreleased,
    they free themselves at ``expires_at``. The id is random and names
    nothing of the check.
    """

    id: str
    expires_at: datetime


@dataclass(frozen=True)
class CheckResult:
    """The outcome of ``check``, ``peek`` or ``reset``.

    ``reason`` says where the decision came from: ``"checked"`` when pglimit
    answered, ``"timeout"`` or ``"error"`` when it did not and ``on_error``
    decided (then ``store`` is ``"none"``, ``degraded`` is true and
    ``buckets`` is empty). ``retry_after`` is whole seconds, 0 when allowed.
    ``headers`` holds every response header, names lowercased.
    """

    allowed: bool
    remaining: int
    limit: int
    reset_at: datetime
    retry_after: int
    buckets: Tuple[BucketResult, ...]
    degraded: bool
    store: Store
    reason: Reason
    shadow: bool = False
    would_allow: Optional[bool] = None
    blocked_by: Optional[str] = None
    override: Optional[Override] = None
    #: Admitted by a concurrency bucket in Postgres (none when admitted from
    #: memory during an outage: those slots end by themselves).
    lease: Optional[Lease] = None
    request_id: Optional[str] = None
    headers: Dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    #: With ``max_wait``: how long pglimit held the check, in ms (0: at once).
    waited_ms: Optional[int] = None

    def bucket(self, name: str) -> Optional[BucketResult]:
        """The bucket called ``name``, or None: buckets come in policy order."""
        for b in self.buckets:
            if b.name == name:
                return b
        return None


_TIMESTAMP = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


def parse_timestamp(value: str) -> datetime:
    """RFC 3339 to an aware UTC datetime.

    Hand-rolled because ``datetime.fromisoformat`` refuses ``Z`` and
    fractions of other than 3 or 6 digits before Python 3.11.
    """
    m = _TIMESTAMP.match(value)
    if m is None:
        raise ValueError(f"not an RFC 3339 timestamp: {value!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    micro = int((m.group(7) or "0").ljust(6, "0")[:6])
    if m.group(8):
        tz = timezone.utc
    else:
        offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = timezone(-offset if m.group(9) == "-" else offset)
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).astimezone(
        timezone.utc
    )


def _int(obj: Mapping[str, Any], key: str) -> int:
    value = obj[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is not an integer")
    return value


def _bool(obj: Mapping[str, Any], key: str) -> bool:
    value = obj[key]
    if not isinstance(value, bool):
        raise ValueError(f"{key} is not a boolean")
    return value


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string")
    return value


_STORES = ("postgres", "memory", "none")
_ALGORITHMS = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "concurrency")
_ACTIONS = ("limits", "unlimited", "deny")


def _bucket(obj: Any) -> BucketResult:
    if not isinstance(obj, dict):
        raise ValueError("a bucket is not an object")
    algorithm = _str(obj, "algorithm")
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    return BucketResult(
        name=_str(obj, "name"),
        algorithm=algorithm,  # type: ignore[arg-type]  # checked just above
        allowed=_bool(obj, "allowed"),
        limit=_int(obj, "limit"),
        remaining=_int(obj, "remaining"),
        reset_at=parse_timestamp(_str(obj, "reset_at")),
        blocked=obj.get("blocked") is True,
    )


def parse_decision(
    body: Any, request_id: Optional[str], headers: Dict[str, str]
) -> CheckResult:
    """A ``Decision`` body (openapi.json) to a :class:`CheckResult`.

    Raises ValueError (or KeyError) on a body of the wrong shape, which the
    clients report as pglimit being unavailable: a garbled answer decides
    nothing.
    """
    if not isinstance(body, dict):
        raise ValueError("the answer is not a JSON object")
    store = _str(body, "store")
    if store not in _STORES:
        raise ValueError(f"unknown store {store!r}")
    retry = body["retry_after_s"]
    if retry is not None and (not isinstance(retry, int) or isinstance(retry, bool)):
        raise ValueError("retry_after_s is not an integer")
    raw_buckets = body["buckets"]
    if not isinstance(raw_buckets, list):
        raise ValueError("buckets is not an array")
    override: Optional[Override] = None
    raw_override = body.get("override")
    if raw_override is not None:
        if not isinstance(raw_override, dict):
            raise ValueError("override is not an object")
        action = _str(raw_override, "action")
        if action not in _ACTIONS:
            raise ValueError(f"unknown override action {action!r}")
        index = _int(raw_override, "index") if "index" in raw_override else None
        id_ = _str(raw_override, "id") if "id" in raw_override else None
        if (index is None) == (id_ is None):
            raise ValueError("override has neither index nor id, or both")
        override = Override(index=index, action=action, id=id_)  # type: ignore[arg-type]
    would_allow = body.get("would_allow")
    blocked_by = body.get("blocked_by")
    raw_lease = body.get("lease")
    lease = parse_lease(raw_lease) if raw_lease is not None else None
    waited = body.get("waited_ms")
    waited_ms = waited if isinstance(waited, int) and not isinstance(waited, bool) else None
    return CheckResult(
        allowed=_bool(body, "allowed"),
        remaining=_int(body, "remaining"),
        limit=_int(body, "limit"),
        reset_at=parse_timestamp(_str(body, "reset_at")),
        retry_after=retry or 0,
        buckets=tuple(_bucket(b) for b in raw_buckets),
        degraded=_bool(body, "degraded"),
        store=store,  # type: ignore[arg-type]  # checked above
        reason="checked",
        shadow=body.get("shadow") is True,
        would_allow=would_allow if isinstance(would_allow, bool) else None,
        blocked_by=blocked_by if isinstance(blocked_by, str) else None,
        override=override,
        lease=lease,
        request_id=request_id,
        headers=headers,
        waited_ms=waited_ms,
    )


def parse_lease(obj: Any) -> Lease:
    """A ``Lease`` object (openapi.json) to a :class:`Lease`."""
    if not isinstance(obj, dict):
        raise ValueError("lease is not an object")
    return Lease(id=_str(obj, "id"), expires_at=parse_timestamp(_str(obj, "expires_at")))


def fallback_result(allowed: bool, reason: Reason) -> CheckResult:
    """What ``on_error="allow"``/``"deny"`` answer when pglimit did not.

    A denial says ``retry_after=1`` so that a caller forwarding it tells its
    client to come back soon rather than never; nothing was counted, so
    ``store`` is ``"none"`` and the figures are zero.
    """
    now = datetime.now(timezone.utc)
    return CheckResult(
        allowed=allowed,
        remaining=0,
        limit=0,
        reset_at=now if allowed else now + timedelta(seconds=1),
        retry_after=0 if allowed else 1,
        buckets=(),
        degraded=True,
        store="none",
        reason=reason,
    )
