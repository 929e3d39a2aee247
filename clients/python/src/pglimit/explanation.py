"""The answer of ``explain``: what a check would answer now, and why.

Frozen dataclasses, as :class:`~pglimit.CheckResult` is, parsed from the
``Explanation`` schema of openapi.json (``POST /admin/explain``). Each
bucket's stored state is a dataclass of its algorithm's own terms, so
``isinstance`` tells them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Dict, Literal, Mapping, Optional, Tuple, Union

from .result import (
    _ACTIONS,
    _ALGORITHMS,
    Algorithm,
    Override,
    Store,
    _bool,
    _int,
    _str,
    parse_timestamp,
)

__all__ = [
    "Block",
    "BucketState",
    "ConcurrencyState",
    "ExplainReason",
    "ExplainedBucket",
    "Explanation",
    "FixedWindowState",
    "KeyDenials",
    "SlidingLogState",
    "SlidingWindowState",
    "TokenBucketState",
]

ExplainReason = Literal["allowed", "denied", "blocked", "allow_listed", "deny_listed", "store_unavailable"]
BlockKind = Literal["admin", "lockout"]
_REASONS = ("allowed", "denied", "blocked", "allow_listed", "deny_listed", "store_unavailable")
_KINDS = ("admin", "lockout")


@dataclass(frozen=True)
class FixedWindowState:
    """Units taken in the current window, and when it ends."""

    count: int
    window_ends_at: datetime


@dataclass(frozen=True)
class SlidingWindowState:
    """Units taken in the clock-aligned window started at ``window_started_at``, and in the one before."""

    window_started_at: datetime
    count: int
    previous_window_count: int


@dataclass(frozen=True)
class SlidingLogState:
    """When each unit still counted was taken, oldest first."""

    entries: Tuple[datetime, ...]


@dataclass(frozen=True)
class TokenBucketState:
    """When the bucket would be full again (GCRA's theoretical arrival time)."""

    theoretical_arrival_time: datetime


@dataclass(frozen=True)
class ConcurrencyState:
    """Slots held by unexpired leases, and when the first of them ends."""

    slots_held: int
    earliest_lease_end: datetime


BucketState = Union[FixedWindowState, SlidingWindowState, SlidingLogState, TokenBucketState, ConcurrencyState]


@dataclass(frozen=True)
class Block:
    """A block on a bucket's key: an operator's (``admin``, ``POST /admin/blocks``)
    or a lockout (``lockout``, the bucket's ``block_for``)."""

    kind: BlockKind
    reason: Optional[str]
    until: datetime
    since: datetime


@dataclass(frozen=True)
class KeyDenials:
    """A key's denials in the top list (``GET /admin/top``), summed over every pglimit instance.

    ``count`` denials since ``since`` (the explanation's ``checked_at`` less
    the list's retention, ``PGLIMIT_TOP_RETENTION``, 7 days by default);
    ``last`` when the last minute with a denial began, ``None`` when there
    was none.
    """

    count: int
    last: Optional[datetime]
    since: datetime


@dataclass(frozen=True)
class ExplainedBucket:
    """One bucket of an explained check: its state, and why it allows or denies.

    ``key`` is the first 16 hex digits of the bucket's key, never the
    identifiers; ``limit`` the limit in force (an override's, or this
    instance's share during an outage); ``window`` a concurrency bucket's
    lease; ``state`` ``None`` when nothing stored counts (a full bucket);
    ``retry_after`` whole seconds until a check of this cost passes this
    bucket, 0 when it has room; ``waiters`` the checks this pglimit instance
    holds waiting (``max_wait``) on the key; ``denials`` how often the key
    was denied over the top list's retention, ``None`` when pglimit's top
    list is off or could not be read.
    """

    name: str
    key: str
    algorithm: Algorithm
    limit: int
    window: timedelta
    state: Optional[BucketState]
    allowed: bool
    remaining: int
    reset_at: datetime
    retry_after: int
    block: Optional[Block]
    waiters: int
    why: str
    denials: Optional[KeyDenials] = None


@dataclass(frozen=True)
class Explanation:
    """What ``check`` would answer now for the same arguments, and why; nothing was counted.

    ``reason`` names what decides and ``why`` says it in a sentence or two;
    ``rule`` is the override that applies (``index`` for the policy file's,
    ``id`` for the API's). ``allowed`` is true for a shadow policy, whose
    ``would_allow`` says what enforcing would answer. ``store`` is
    ``"memory"`` (and ``degraded`` true) when read from this instance's
    memory while Postgres is away. ``remembered_denial_until``: this
    instance repeats its last denial of this exact check until then
    without asking Postgres.
    """

    policy: Optional[str]
    cost: int
    allowed: bool
    reason: ExplainReason
    why: str
    rule: Optional[Override]
    store: Store
    degraded: bool
    checked_at: datetime
    buckets: Tuple[ExplainedBucket, ...]
    shadow: bool = False
    would_allow: Optional[bool] = None
    remembered_denial_until: Optional[datetime] = None
    request_id: Optional[str] = None

    def bucket(self, name: str) -> Optional[ExplainedBucket]:
        """The bucket called ``name``, or None: buckets come in policy order."""
        for b in self.buckets:
            if b.name == name:
                return b
        return None


def _time(obj: Mapping[str, Any], key: str) -> datetime:
    return parse_timestamp(_str(obj, key))


def _object(value: Any, what: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _state(algorithm: str, obj: Any) -> BucketState:
    s = _object(obj, "state")
    if algorithm == "fixed_window":
        return FixedWindowState(count=_int(s, "count"), window_ends_at=_time(s, "window_ends_at"))
    if algorithm == "sliding_window":
        return SlidingWindowState(
            window_started_at=_time(s, "window_started_at"),
            count=_int(s, "count"),
            previous_window_count=_int(s, "previous_window_count"),
        )
    if algorithm == "sliding_log":
        entries = s["entries"]
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ValueError("entries is not an array of timestamps")
        return SlidingLogState(entries=tuple(parse_timestamp(e) for e in entries))
    if algorithm == "token_bucket":
        return TokenBucketState(theoretical_arrival_time=_time(s, "theoretical_arrival_time"))
    return ConcurrencyState(slots_held=_int(s, "slots_held"), earliest_lease_end=_time(s, "earliest_lease_end"))


def _block(obj: Any) -> Block:
    b = _object(obj, "block")
    kind = _str(b, "kind")
    if kind not in _KINDS:
        raise ValueError(f"unknown block kind {kind!r}")
    reason = b["reason"]
    if reason is not None and not isinstance(reason, str):
        raise ValueError("block reason is not a string")
    return Block(kind=kind, reason=reason, until=_time(b, "until"), since=_time(b, "since"))  # type: ignore[arg-type]


def _denials(obj: Any) -> KeyDenials:
    d = _object(obj, "denials")
    last = d["last"]
    if last is not None and not isinstance(last, str):
        raise ValueError("denials last is not a timestamp")
    return KeyDenials(
        count=_int(d, "count"),
        last=None if last is None else parse_timestamp(last),
        since=_time(d, "since"),
    )


def _explained_bucket(obj: Any) -> ExplainedBucket:
    b = _object(obj, "a bucket")
    algorithm = _str(b, "algorithm")
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    window_s = b["window_s"]
    if not isinstance(window_s, (int, float)) or isinstance(window_s, bool):
        raise ValueError("window_s is not a number")
    retry = b["retry_after_s"]
    if retry is not None and (not isinstance(retry, int) or isinstance(retry, bool)):
        raise ValueError("retry_after_s is not an integer")
    return ExplainedBucket(
        name=_str(b, "name"),
        key=_str(b, "key"),
        algorithm=algorithm,  # type: ignore[arg-type]  # checked just above
        limit=_int(b, "limit"),
        window=timedelta(seconds=window_s),
        state=None if b["state"] is None else _state(algorithm, b["state"]),
        allowed=_bool(b, "allowed"),
        remaining=_int(b, "remaining"),
        reset_at=_time(b, "reset_at"),
        retry_after=retry or 0,
        block=None if b["block"] is None else _block(b["block"]),
        waiters=_int(b, "waiters"),
        why=_str(b, "why"),
        # Absent from a pglimit older than the top list: as if it were off.
        denials=None if b.get("denials") is None else _denials(b["denials"]),
    )


def _rule(obj: Any) -> Optional[Override]:
    if obj is None:
        return None
    r = _object(obj, "rule")
    action = _str(r, "action")
    if action not in _ACTIONS:
        raise ValueError(f"unknown rule action {action!r}")
    by = _str(r, "by")
    if by == "file_override":
        return Override(index=_int(r, "index"), action=action)  # type: ignore[arg-type]
    if by == "api_override":
        return Override(index=None, action=action, id=_str(r, "id"))  # type: ignore[arg-type]
    raise ValueError(f"unknown rule {by!r}")


def parse_explanation(body: Any, request_id: Optional[str]) -> Explanation:
    """An ``Explanation`` body (openapi.json) to an :class:`Explanation`.

    Raises ValueError (or KeyError, TypeError) on a body of the wrong shape.
    """
    e = _object(body, "the answer")
    reason = _str(e, "reason")
    if reason not in _REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    store = _str(e, "store")
    if store not in ("postgres", "memory"):
        raise ValueError(f"unknown store {store!r}")
    policy = e["policy"]
    if policy is not None and not isinstance(policy, str):
        raise ValueError("policy is not a string")
    raw_buckets = e["buckets"]
    if not isinstance(raw_buckets, list):
        raise ValueError("buckets is not an array")
    would_allow = e.get("would_allow")
    remembered = e.get("remembered_denial_until")
    return Explanation(
        policy=policy,
        cost=_int(e, "cost"),
        allowed=_bool(e, "allowed"),
        reason=reason,  # type: ignore[arg-type]  # checked above
        why=_str(e, "why"),
        rule=_rule(e["rule"]),
        store=store,  # type: ignore[arg-type]  # checked above
        degraded=_bool(e, "degraded"),
        checked_at=_time(e, "checked_at"),
        buckets=tuple(_explained_bucket(b) for b in raw_buckets),
        shadow=e.get("shadow") is True,
        would_allow=would_allow if isinstance(would_allow, bool) else None,
        remembered_denial_until=parse_timestamp(remembered) if isinstance(remembered, str) else None,
        request_id=request_id,
    )
