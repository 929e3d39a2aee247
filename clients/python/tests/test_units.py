"""Pure parts: timestamps, bodies, the headers helper, argument checks; the message without a binary."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from pglimit import AsyncPglimit, CheckResult, Pglimit, rate_limit_headers
from pglimit._core import build_body, format_window
from pglimit.result import parse_timestamp


def test_timestamps_are_aware_utc() -> None:
    want = datetime(2026, 11, 29, 15, 17, 53, 942000, tzinfo=timezone.utc)
    assert parse_timestamp("2026-11-29T15:17:53.942Z") == want
    assert parse_timestamp("2026-11-29T16:17:53.942+01:00") == want
    assert parse_timestamp("2026-11-29T15:17:53.9420001Z") == want
    assert parse_timestamp("2026-11-29T15:17:53Z").tzinfo == timezone.utc
    with pytest.raises(ValueError):
        parse_timestamp("2026-11-29 15:17")


def test_bodies() -> None:
    common = {"key": None, "limit": None, "window": None, "algorithm": None}
    assert build_body(policy="login", identifiers={"ip": "::1"}, cost=1, **common) == {
        "policy": "login",
        "identifiers": {"ip": "::1"},
        "cost": 1,
    }
    assert build_body(
        policy=None, identifiers=None, key="k", limit=3, window=timedelta(minutes=1),
        algorithm="token_bucket", cost=0, buckets=["default"],
    ) == {"key": "k", "limit": 3, "window": "60s", "cost": 0, "algorithm": "token_bucket",
          "buckets": ["default"]}  # fmt: skip
    assert format_window(timedelta(milliseconds=1500)) == "1500ms"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"policy": "login"},
        {"key": "k", "limit": 1},
        {"policy": "login", "identifiers": {}, "key": "k"},
        {"key": "k", "limit": 1, "window": "1m", "identifiers": {}},
    ],
)
def test_mixed_or_missing_forms_are_type_errors(kwargs: dict[str, object]) -> None:
    full = {"policy": None, "identifiers": None, "key": None, "limit": None, "window": None,
            "algorithm": None, "cost": 1, **kwargs}  # fmt: skip
    with pytest.raises(TypeError):
        build_body(**full)  # type: ignore[arg-type]


def test_buckets_must_be_a_list() -> None:
    with pytest.raises(TypeError):
        build_body(policy="login", identifiers={}, key=None, limit=None, window=None,
                   algorithm=None, cost=0, buckets="email_ip")  # fmt: skip


@pytest.mark.parametrize("cls", [Pglimit, AsyncPglimit])
def test_constructor_checks(cls: type) -> None:
    with pytest.raises(ValueError):
        cls("http://127.0.0.1:1", on_error="maybe")
    with pytest.raises(ValueError):
        cls("http://127.0.0.1:1", timeout=0)
    with pytest.raises(ValueError):
        cls("127.0.0.1:8080")


def test_headers_helper_prefers_pglimit_headers() -> None:
    r = CheckResult(
        allowed=False, remaining=0, limit=5, reset_at=datetime.now(timezone.utc),
        retry_after=42, buckets=(), degraded=False, store="postgres", reason="checked",
        headers={"ratelimit": '"default";r=0;t=42', "ratelimit-policy": '"default";q=5;w=60',
                 "retry-after": "42", "x-request-id": "x"},
    )  # fmt: skip
    assert rate_limit_headers(r) == {
        "RateLimit-Policy": '"default";q=5;w=60',
        "RateLimit": '"default";r=0;t=42',
        "Retry-After": "42",
    }
    # A deny-listed check has no end: no Retry-After.
    denied_forever = CheckResult(
        allowed=False, remaining=0, limit=5, reset_at=datetime.now(timezone.utc),
        retry_after=0, buckets=(), degraded=False, store="postgres", reason="checked",
    )  # fmt: skip
    assert rate_limit_headers(denied_forever) == {}


def test_results_are_frozen_and_hashable() -> None:
    r = CheckResult(
        allowed=True, remaining=1, limit=2, reset_at=datetime.now(timezone.utc),
        retry_after=0, buckets=(), degraded=False, store="postgres", reason="checked",
        headers={"a": "b"},
    )  # fmt: skip
    with pytest.raises(AttributeError):
        r.allowed = False  # type: ignore[misc]
    hash(r)



def test_without_a_pglimit_binary_pytest_says_in_one_line_what_to_run_and_exits_1(tmp_path: Path) -> None:
    missing = tmp_path / "pglimit"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_checks.py"],
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "PGLIMIT_BIN": str(missing)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    said = [line for line in run.stdout.splitlines() if "no pglimit binary" in line]
    assert len(said) == 1, run.stdout
    assert f"no pglimit binary at {missing}: run `cargo build`" in said[0]
    assert said[0].endswith("or set PGLIMIT_BIN !"), said[0]


def test_an_override_is_named_by_the_files_index_or_the_apis_id() -> None:
    from pglimit.result import parse_decision

    body = {"allowed": True, "limit": 5, "remaining": 4, "reset_at": "2026-11-29T15:17:53.942Z",
            "retry_after_s": None, "store": "postgres", "degraded": False, "buckets": []}  # fmt: skip
    by_file = parse_decision({**body, "override": {"index": 2, "action": "deny"}}, None, {})
    assert by_file.override is not None and (by_file.override.index, by_file.override.id) == (2, None)
    by_api = parse_decision({**body, "override": {"id": "ovr_1", "action": "limits"}}, None, {})
    assert by_api.override is not None and (by_api.override.index, by_api.override.id) == (None, "ovr_1")
    with pytest.raises(ValueError):
        parse_decision({**body, "override": {"action": "limits"}}, None, {})
