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
from trio_jobs.drivers._window import MIN_WAIT, SlidingLog, exact_wait, short_wait


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
            # never before the oldest take that must leave leaves; exactly then
            # when that is near (else a later place in the queue of the refused)
            leaves = max(MIN_WAIT, in_window[0] + per - now)
            assert wait >= leaves - 1e-9
            if leaves <= exact_wait(limit, per):
                assert wait == pytest.approx(leaves)
    for i in range(len(granted) - limit):
        # take i is out of the window (t - per, t] of take i + limit
        assert granted[i] <= granted[i + limit] - per


# --------------------------------------------------------------------------- the queue of the refused


def test_the_refused_are_promised_one_freed_slot_each_round_after_round() -> None:
    log = SlidingLog()
    assert log.take("b", 2, 10.0, 100.0) is None
    assert log.take("b", 2, 10.0, 104.0) is None
    # five refused at 105: the slots free at 110 and 114, then every 10 s
    promised = [105.0 + log.take("b", 2, 10.0, 105.0) for _ in range(5)]  # type: ignore[operator]
    assert promised == pytest.approx([110.0, 114.0, 120.0, 124.0, 130.0])
    # each comes back at its place and is granted: no one meets another
    for at in promised:
        assert log.take("b", 2, 10.0, at) is None
    # the queue has passed: the next refusal is told when the oldest leaves
    assert log.take("b", 2, 10.0, 131.0) == pytest.approx(124.0 + 10.0 - 131.0)


def test_a_refusal_near_the_slot_is_told_the_slot_and_takes_no_place() -> None:
    log = SlidingLog()
    assert exact_wait(2, 10.0) == 1.0
    assert log.take("b", 2, 10.0, 100.0) is None
    assert log.take("b", 2, 10.0, 104.0) is None
    assert log.take("b", 2, 10.0, 105.0) == pytest.approx(5.0)  # place 0: 110
    assert log.take("b", 2, 10.0, 109.5) == pytest.approx(0.5)  # near: no place
    # the place it did not take is the next refusal's (a clock may step back)
    assert log.take("b", 2, 10.0, 106.0) == pytest.approx(8.0)  # place 1: 114


def test_a_queue_the_window_outran_is_opened_again() -> None:
    # found by the property below: others took the slots the queue promised
    log = SlidingLog()
    for _ in range(2):
        assert log.take("b", 2, 2.0, 1000.0) is None
    assert [log.take("b", 2, 2.0, 1000.0) for _ in range(3)] == pytest.approx([2.0, 2.0, 4.0])
    for _ in range(2):
        assert log.take("b", 2, 2.0, 1003.0) is None
    # the queue's next place (1004) would come before a grant can leave (1005)
    assert log.take("b", 2, 2.0, 1003.0) == pytest.approx(2.0)


def test_a_queue_of_another_limit_is_not_reused() -> None:
    log = SlidingLog()
    for at in (0.0, 1.0, 2.0):
        assert log.take("b", 3, 10.0, at) is None
    assert log.take("b", 3, 10.0, 3.0) == pytest.approx(7.0)  # queue on [0, 1, 2]
    # a limit of 1 needs all three gone: a queue of its own, on the newest grant
    assert log.take("b", 1, 10.0, 3.0) == pytest.approx(9.0)
    assert log.take("b", 1, 10.0, 3.0) == pytest.approx(19.0)


def test_a_bucket_with_a_queue_ahead_is_not_swept() -> None:
    log = SlidingLog()
    log.take("q", 1, 1.0, 0.0)
    for _ in range(10):
        log.take("q", 1, 1.0, 0.5)  # promised up to 10.0
    for i in range(2000):
        log.take(f"k{i}", 1, 1.0, 5.0 + i * 0.001)
    assert log.count("q", 1.0, 0.5) == 1
    assert "q" in log._logs


def test_the_short_wait_is_a_slots_share_at_most_a_quarter_second() -> None:
    assert short_wait(60, 6.0) == pytest.approx(0.1)
    assert short_wait(1, 3600.0) == 0.25
    assert exact_wait(60, 6.0) == 1.0
    assert exact_wait(100, 1.0) == 0.25
    assert exact_wait(1, 0.1) == pytest.approx(0.1)  # never below the short wait


@given(
    limit=st.integers(1, 6),
    per=st.floats(2.0, 20.0),
    gaps=st.lists(st.floats(0.0, 0.3), min_size=1, max_size=6),
    herd=st.integers(1, 30),
)
def test_a_herd_refused_at_once_is_spread_at_most_limit_per_window(
    limit: int, per: float, gaps: list[float], herd: int
) -> None:
    log = SlidingLog()
    now = 1000.0
    grants = 0
    for gap in gaps:
        now += gap
        if log.take("k", limit, per, now) is None:
            grants += 1
    if grants < limit:
        return  # the window is not full: nothing is refused
    now += 0.01
    promised = []
    for _ in range(herd):
        wait = log.take("k", limit, per, now)
        assert wait is not None
        promised.append(now + wait)
    assert promised == sorted(promised)
    # at most `limit` told to come back in any interval of length `per`
    for i in range(len(promised) - limit):
        assert promised[i + limit] - promised[i] >= per - 1e-6
