"""The JSON bodies of /check and /reset, built from a method's arguments.

Apart from the rest of the core because it is the one part that knows the
argument forms (a policy's, a key's, a concurrency key's) and rejects their
mixtures before anything is sent.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from .result import Algorithm

Window = Union[str, timedelta]


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
