"""Spec: "Rate limits" (PYTHON-API.md): ``rate_limiter(name, *, limit, per,
scope="shared")`` refuses a bad declaration at the call, naming every fault,
and its window is a sliding one: at most ``limit`` acquisitions in any interval
of length ``per``."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_jobs import ErrorCode, JobsError, RateLimiter, Worker, rate_limiter
from trio_jobs._rate import MAX_RATE_LIMIT, tenant_rate
from trio_jobs.drivers._window import MIN_WAIT, SlidingLog


def test_a_good_declaration_resolves_its_window_to_seconds() -> None:
    vendor = rate_limiter("mail-vendor", limit=600, per="1m")
    assert isinstance(vendor, RateLimiter)
    assert (vendor.name, vendor.limit, vendor.per, vendor.scope) == (
        "mail-vendor",
        600,
        60.0,
        "shared",
    )
    assert rate_limiter("x", limit=1, per=timedelta(seconds=2), scope="process").per == 2.0
    assert rate_limiter("x", limit=MAX_RATE_LIMIT, per=0.5).limit == MAX_RATE_LIMIT


def test_limit_and_per_not_positive_are_refused_together() -> None:
    with pytest.raises(JobsError) as caught:
        rate_limiter("vendor", limit=0, per="0s")
    err = caught.value
    assert err.code == ErrorCode.X_CONFIG_INVALID
    assert len(err.meta["faults"]) == 2
    assert "limit must be a whole number" in err.message
    assert "per is not a valid duration" in err.message
    assert "'vendor'" in err.message


@pytest.mark.parametrize(
    ("fields", "fault"),
    [
        ({"limit": -1}, "limit must be"),
        ({"limit": 1.5}, "limit must be"),
        ({"limit": True}, "limit must be"),
        ({"limit": "10"}, "limit must be"),
        ({"limit": MAX_RATE_LIMIT + 1}, "use a shorter window"),
        ({"per": -5}, "per is not a valid duration"),
        ({"per": math.nan}, "per is not a valid duration"),
        ({"per": "soon"}, "per is not a valid duration"),
        ({"per": None}, "per is not a valid duration"),
        ({"name": ""}, "name must be"),
        ({"name": 7}, "name must be"),
        ({"name": "a\x00b"}, "name cannot be stored"),
        ({"name": "n" * 201}, "name must be"),
        ({"scope": "fleet"}, "scope must be"),
    ],
)
def test_each_fault_is_named(fields: dict[str, Any], fault: str) -> None:
    args: dict[str, Any] = {"name": "vendor", "limit": 10, "per": "1s", "scope": "shared", **fields}
    name = args.pop("name")
    with pytest.raises(JobsError) as caught:
        rate_limiter(name, **args)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    assert fault in caught.value.message
    assert caught.value.meta["faults"] == [caught.value.message.split(": ", 1)[1]]


def test_every_fault_at_once() -> None:
    with pytest.raises(JobsError) as caught:
        rate_limiter("", limit=0, per=-1, scope="everywhere")  # type: ignore[arg-type]
    assert len(caught.value.meta["faults"]) == 4


@given(limit=st.integers(-3, 5), per=st.floats(allow_nan=True, allow_infinity=True))
def test_a_declaration_is_refused_exactly_when_limit_or_per_is_not_positive(
    limit: int, per: float
) -> None:
    bad_limit = limit < 1
    bad_per = not (math.isfinite(per) and 0 < per <= 100 * 365.25 * 86400)
    try:
        made = rate_limiter("h", limit=limit, per=per)
    except JobsError as exc:
        assert exc.code == ErrorCode.X_CONFIG_INVALID
        assert bad_limit or bad_per
        assert len(exc.meta["faults"]) == bad_limit + bad_per
    else:
        assert not bad_limit
        assert not bad_per
        assert made.per == per


def test_the_worker_refuses_a_bad_rate_per_tenant_or_fleet() -> None:
    for bad, fault in [
        ((0, "1s"), "limit must be"),
        ((2, "0s"), "per is not a valid duration"),
        (5, "must be a pair"),
        ("5/1s", "must be a pair"),
        ((1, 2, 3), "must be a pair"),
    ]:
        with pytest.raises(JobsError) as caught:
            tenant_rate(bad)
        assert caught.value.code == ErrorCode.X_CONFIG_INVALID
        assert fault in caught.value.message
    with pytest.raises(JobsError) as both:
        tenant_rate((0, -1))
    assert len(both.value.meta["faults"]) == 2
    assert tenant_rate(None) is None
    rate = tenant_rate((3, "1m"))
    assert rate is not None
    assert (rate.limit, rate.per) == (3, 60.0)


async def test_worker_checks_its_rate_options_when_built() -> None:
    from trio_jobs import memory_driver, open_jobs

    async with open_jobs(memory_driver()) as jobs:
        with pytest.raises(JobsError) as caught:
            Worker(jobs, rate_per_tenant=(0, "1s"))
        assert caught.value.code == ErrorCode.X_CONFIG_INVALID
        with pytest.raises(JobsError) as fleet:
            Worker(jobs, fleet="all")
        assert fleet.value.code == ErrorCode.X_CONFIG_INVALID
        assert Worker(jobs, fleet="single").fleet == "single"
        assert Worker(jobs).fleet == "many"


# --------------------------------------------------------------------------- the window


def test_the_window_slides() -> None:
    log = SlidingLog()
    assert log.take("b", 2, 10.0, 100.0) is None
    assert log.take("b", 2, 10.0, 104.0) is None
    assert log.take("b", 2, 10.0, 105.0) == pytest.approx(5.0)  # 100 leaves at 110
    assert log.take("b", 2, 10.0, 109.999) == pytest.approx(0.001)
    assert log.take("b", 2, 10.0, 110.0) is None  # (100, 110]: 100 is out
    assert log.take("b", 2, 10.0, 113.0) == pytest.approx(1.0)  # 104 leaves at 114
    assert log.take("other", 2, 10.0, 113.0) is None  # buckets are apart


def test_a_refusal_never_answers_less_than_the_minimum_wait() -> None:
    log = SlidingLog()
    assert log.take("b", 1, 0.1, 0.2) is None
    wait = log.take("b", 1, 0.1, 0.2 + 0.1 - 1e-12)
    assert wait == MIN_WAIT


def test_empty_windows_are_swept() -> None:
    log = SlidingLog()
    for i in range(2000):
        log.take(f"k{i}", 1, 1.0, float(i))
    assert len(log) < 1100


@given(
    limit=st.integers(1, 5),
    per=st.floats(0.5, 20.0),
    gaps=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=60),
)
def test_at_most_limit_in_any_window_and_refused_only_when_full(
    limit: int, per: float, gaps: list[float]
) -> None:
    log = SlidingLog()
    now = 1000.0
    granted: list[float] = []
    for gap in gaps:
        now += gap
        wait = log.take("k", limit, per, now)
        in_window = [g for g in granted if g > now - per]
        if wait is None:
            assert len(in_window) < limit
            granted.append(now)
        else:
            assert len(in_window) == limit
            # the wait is when the oldest take that must leave leaves
            assert wait == pytest.approx(max(MIN_WAIT, in_window[0] + per - now))
    for i in range(len(granted) - limit):
        # take i is out of the window (t - per, t] of take i + limit
        assert granted[i] <= granted[i + limit] - per
