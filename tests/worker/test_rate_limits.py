"""Spec: "Rate limits" (PYTHON-API.md) and the rate rows of "Concurrency, rate
limits, queues, retry", on the memory driver: ``rate_limiter().acquire()`` in a
body, ``X_RATE_LIMIT_NOT_SHARED`` unless the worker is the whole fleet, and
``Worker(rate_per_tenant=...)``.

PostgreSQL (two real processes sharing one budget) and Redis are in
``tests/drivers/postgres/test_rate_limits.py`` and
``tests/drivers/redis/test_rate_limits.py``; the store's own rules are in the
conformance suite.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import attrs
import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import (
    Concurrency,
    ErrorCode,
    JobContext,
    JobsError,
    Retry,
    current_jobs,
    job,
    memory_driver,
    open_jobs,
    rate_limiter,
)
from trio_jobs.testing import open_harness


def _spread(times: list[float], limit: int, per: float) -> None:
    """At most ``limit`` of ``times`` in any interval of length ``per``."""
    times = sorted(times)
    for i in range(len(times) - limit):
        assert times[i + limit] - times[i] >= per - 1e-6, (i, times)


def metered_job(limit: int, per: str, *, scope: str = "shared", name: str = "rate.metered") -> Any:
    limiter = rate_limiter("vendor", limit=limit, per=per, scope=scope)  # type: ignore[arg-type]
    granted: list[tuple[float, int]] = []

    @job(input=Item, idempotency_key=lambda i: i.key, name=name, retry=Retry(attempts=1))
    async def metered(ctx: JobContext[Item]) -> str:
        await limiter.acquire()
        granted.append((current_jobs().driver.now(), ctx.attempt))
        return await ctx.step.run("send", lambda: ctx.input.key)

    return metered, granted


# --------------------------------------------------------------------------- rate_limiter()


async def test_the_harness_runs_a_backlog_within_the_budget(autojump_clock: Any) -> None:
    """The harness is the whole fleet: a shared limiter lives in its memory driver,
    and its fast-forward carries deferred runs to their retry-after."""
    metered, granted = metered_job(2, "10s")
    async with open_harness(jobs=[metered]) as h:
        for i in range(7):
            await metered.enqueue(Item(f"k{i}"))
        await h.drain()
        views = (await h.jobs.list(limit=50)).rows
    assert sorted(v.state for v in views) == ["done"] * 7
    assert {v.attempts for v in views} == {1}  # attempts=1: never dead for waiting
    assert [a for _t, a in granted] == [1] * 7
    _spread([t for t, _a in granted], 2, 10.0)
    times = sorted(t for t, _a in granted)
    assert times[-1] - times[0] >= 30.0  # 7 at 2 per 10 s need three more windows


async def test_a_real_worker_spends_the_budget_per_window_one_deferral_per_run(
    autojump_clock: Any,
) -> None:
    """N runs over a budget of k per window: never more than k started in any
    window, every run started on its first attempt, and each run that did not
    fit the first window deferred once: the refused are told one freed slot
    each, round after round, not all the first slot to free."""
    metered, granted = metered_job(3, "10s")
    async with jobs_on_memory([metered]) as (jobs, driver):
        ids = [(await metered.enqueue(Item(f"k{i}"))).id for i in range(14)]
        async with running_worker(jobs, concurrency=8, fleet="single"):
            for job_id in ids:
                view = await wait_state(jobs, job_id, "done", "dead", "failed")
                assert (view.state, view.attempts) == ("done", 1)
        logs = [await driver.attempt_log(i) for i in ids]
    assert len(granted) == 14
    assert {a for _t, a in granted} == {1}
    _spread([t for t, _a in granted], 3, 10.0)
    deferrals = [sum(1 for a in log if a.outcome == "handed-back") for log in logs]
    assert sorted(deferrals) == [0] * 3 + [1] * 11
    times = sorted(t for t, _a in granted)
    assert times[-1] - times[0] == pytest.approx(40.0)  # 14 at 3 per 10 s: four more windows


async def test_keys_split_one_budget(autojump_clock: Any) -> None:
    limiter = rate_limiter("per-account", limit=1, per="1m")
    seen: list[tuple[str, float]] = []

    @job(input=Item, idempotency_key=lambda i: i.key)
    async def sync(ctx: JobContext[Item]) -> None:
        await limiter.acquire(key=ctx.input.group)
        seen.append((ctx.input.group, current_jobs().driver.now()))

    async with open_harness(jobs=[sync]) as h:
        start = h.clock.now()
        for i in range(2):
            for account in ("a", "b"):
                await sync.enqueue(Item(f"{account}{i}", group=account))
        await h.drain()
    by: dict[str, list[float]] = defaultdict(list)
    for account, at in seen:
        by[account].append(at - start)
    # one account does not wait for the other
    assert max(by["a"][0], by["b"][0]) < 1.0
    assert min(by["a"][1], by["b"][1]) >= 60.0


async def test_shared_scope_on_the_memory_driver_needs_a_single_fleet(autojump_clock: Any) -> None:
    metered, granted = metered_job(5, "1m")
    async with jobs_on_memory([metered]) as (jobs, _driver):
        refused = await metered.enqueue(Item("many"))
        async with running_worker(jobs):  # fleet="many", the default
            view = await wait_state(jobs, refused.id, "dead", "failed", "done")
        assert view.state == "dead"
        assert view.error_code == ErrorCode.X_RATE_LIMIT_NOT_SHARED
        assert view.last_error is not None
        assert "fleet='single'" in view.last_error
        allowed = await metered.enqueue(Item("single"))
        async with running_worker(jobs, fleet="single"):
            assert (await wait_state(jobs, allowed.id, "done")).attempts == 1
    assert len(granted) == 1


async def test_shared_scope_outside_a_worker_is_refused_on_memory(autojump_clock: Any) -> None:
    limiter = rate_limiter("script", limit=5, per="1m")
    async with open_jobs(memory_driver()):
        with pytest.raises(JobsError) as caught:
            await limiter.acquire()
    assert caught.value.code == ErrorCode.X_RATE_LIMIT_NOT_SHARED


async def test_process_scope_needs_no_single_fleet_and_refuses_with_retry_after(
    autojump_clock: Any,
) -> None:
    limiter = rate_limiter("local", limit=2, per="30s", scope="process")
    async with open_jobs(memory_driver()):
        await limiter.acquire()
        await limiter.acquire()
        with pytest.raises(JobsError) as caught:
            await limiter.acquire()
        await limiter.acquire(key="other")
    err = caught.value
    assert err.code == ErrorCode.X_RATE_LIMITED
    assert 0 < err.meta["retry_after_seconds"] <= 30.0
    assert err.meta["limiter"] == "local"
    # a new driver keeps its own process windows
    async with open_jobs(memory_driver()):
        await limiter.acquire()


async def test_acquire_without_a_facade_or_with_a_bad_key_says_what_to_do(
    autojump_clock: Any,
) -> None:
    limiter = rate_limiter("vendor", limit=1, per="1s")
    with pytest.raises(JobsError) as none:
        await limiter.acquire()
    assert none.value.code == ErrorCode.X_CONFIG_INVALID
    async with open_jobs(memory_driver()):
        for bad in (None, "k" * 201, "a\x00b"):
            with pytest.raises(JobsError) as caught:
                await limiter.acquire(key=bad)  # type: ignore[arg-type]
            assert caught.value.code == ErrorCode.X_CONFIG_INVALID


async def test_a_refusal_names_no_key(autojump_clock: Any) -> None:
    limiter = rate_limiter("vendor", limit=1, per="1m", scope="process")
    async with open_jobs(memory_driver()):
        await limiter.acquire(key="customer-4711@example.com")
        with pytest.raises(JobsError) as caught:
            await limiter.acquire(key="customer-4711@example.com")
    assert "4711" not in str(caught.value)
    assert "4711" not in repr(caught.value.meta)


# --------------------------------------------------------------------------- rate_per_tenant


@attrs.frozen
class Work:
    key: str
    tenant: str | None


def tenant_job(**declared: Any) -> tuple[Any, dict[str | None, list[float]]]:
    starts: dict[str | None, list[float]] = defaultdict(list)

    @job(
        input=Work,
        tenant=lambda w: w.tenant,
        idempotency_key=lambda w: w.key,
        retry=Retry(attempts=1),
        **declared,
    )
    async def work(ctx: JobContext[Work]) -> None:
        starts[ctx.input.tenant].append(trio.current_time())
        await trio.sleep(5)

    return work, starts


async def test_a_tenant_over_its_starts_is_deferred_uncounted(autojump_clock: Any) -> None:
    work, starts = tenant_job()
    async with jobs_on_memory([work]) as (jobs, _driver):
        t0 = trio.current_time()
        ids = [(await work.enqueue(Work(f"a{i}", "acme"))).id for i in range(5)]
        ids += [(await work.enqueue(Work(f"g{i}", "globex"))).id for i in range(2)]
        async with running_worker(jobs, concurrency=10, rate_per_tenant=(2, "1m")) as worker:
            views = [await wait_state(jobs, i, "done", "dead", "failed") for i in ids]
    assert {(v.state, v.attempts) for v in views} == {("done", 1)}
    assert len(starts["acme"]) == 5
    _spread(starts["acme"], 2, 60.0)
    assert max(starts["globex"]) - t0 < 1.0  # another tenant is not held back
    assert worker.stats().retried == 0


async def test_runs_without_a_tenant_are_not_limited(autojump_clock: Any) -> None:
    work, starts = tenant_job()
    async with jobs_on_memory([work]) as (jobs, _driver):
        t0 = trio.current_time()
        ids = [(await work.enqueue(Work(f"n{i}", None))).id for i in range(4)]
        async with running_worker(jobs, concurrency=10, rate_per_tenant=(1, "1h")):
            for i in ids:
                await wait_state(jobs, i, "done")
    assert len(starts[None]) == 4
    assert max(starts[None]) - t0 < 1.0


async def test_a_run_handed_back_over_concurrency_spends_no_start(autojump_clock: Any) -> None:
    # One run of the tenant at a time; a 5 s body. Runs 2 and 3 meet the busy
    # key (handed back, no start) while run 1 holds it.
    work, starts = tenant_job(concurrency=Concurrency(1, key=lambda w: w.tenant))
    async with jobs_on_memory([work]) as (jobs, _driver):
        t0 = trio.current_time()
        ids = [(await work.enqueue(Work(f"a{i}", "acme"))).id for i in range(3)]
        async with running_worker(jobs, concurrency=4, rate_per_tenant=(2, "1m")):
            for i in ids:
                await wait_state(jobs, i, "done")
    got = sorted(s - t0 for s in starts["acme"])
    assert got[0] < 1.0
    assert got[1] < 10.0  # started once the key freed: its busy hand-backs spent nothing
    assert got[2] >= 60.0  # the tenant's third start waits for the window


async def test_a_deferred_tenant_run_says_why(autojump_clock: Any) -> None:
    work, _starts = tenant_job()
    async with jobs_on_memory([work]) as (jobs, _driver):
        first = await work.enqueue(Work("a0", "acme"))
        second = await work.enqueue(Work("a1", "acme"))
        async with running_worker(jobs, concurrency=1, rate_per_tenant=(1, "1m")):
            await wait_state(jobs, first.id, "done")
            view = await wait_for(
                lambda: _deferred(jobs, second.id), what="the second run deferred"
            )
    assert view.attempts == 0
    assert view.error_code == ErrorCode.X_RATE_LIMITED
    assert "rate_per_tenant" in view.last_error
    assert "acme" not in view.last_error


async def _deferred(jobs: Any, job_id: str) -> Any:
    view = await jobs.show(job_id)
    return view if view.error_code == ErrorCode.X_RATE_LIMITED else None
