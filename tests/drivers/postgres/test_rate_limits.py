"""Spec: "Rate limits" on PostgreSQL: one budget for the fleet, kept in
``trio_jobs_rate_limits`` and decided in one statement, so acquirers in several
real processes share it; a run refused by it is deferred with the attempt
uncounted, whichever worker process claimed it.

Real time and real processes appear here: each wait is bounded.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_jobs import (
    ErrorCode,
    JobContext,
    JobsError,
    Retry,
    Worker,
    job,
    open_jobs,
    purge_expired,
    rate_limiter,
)
from trio_jobs.drivers.postgres import postgres_driver

from .conftest import FakeClock, sql
from .test_processes import Procs, wait_until
from .test_processes import dsn as dsn  # the fixture: the test's migrated schema

pytestmark = [pytest.mark.postgres]

rate_jobs = importlib.import_module("rate_jobs")
Send = rate_jobs.Send


class RateProcs(Procs):
    """Worker processes whose budget is ``RATE_LIMIT`` per ``RATE_PER``."""

    budget = {"RATE_LIMIT": "8", "RATE_PER": "1h"}

    def _env(self) -> dict[str, str]:
        return {**super()._env(), **self.budget}

    def worker(self, *flags: str) -> subprocess.Popen[bytes]:
        proc = self.spawn(
            "-m", "trio_jobs.cli", "worker", "rate_jobs", "--database-url", self.dsn, *flags
        )
        self.wait_log(proc, "jobs.worker.ready")
        return proc


@pytest.fixture
def rate_procs(dsn: str, pg_dsn: str, pg_schema: str, tmp_path: Path) -> Iterator[RateProcs]:
    for statement in rate_jobs.TABLES.strip().split(";"):
        if statement.strip():
            sql(pg_dsn, pg_schema, statement)
    p = RateProcs(dsn, tmp_path)
    try:
        yield p
    finally:
        p.kill_all()


# --------------------------------------------------------------------------- in this process


async def test_the_store_is_shared_and_a_refusal_says_when(
    pg_dsn: str, pg_schema: str, clock: FakeClock
) -> None:
    limiter = rate_limiter("pg.vendor", limit=2, per="10s")
    async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema, clock=clock)) as jobs:
        assert jobs.driver.rate_limits is not None
        assert jobs.driver.rate_limits.shared is True
        # no single-fleet worker needed: every process reaches this table
        await limiter.acquire()
        clock.advance(3.0)
        await limiter.acquire()
        with pytest.raises(JobsError) as caught:
            await limiter.acquire()
        assert caught.value.code == ErrorCode.X_RATE_LIMITED
        assert caught.value.meta["retry_after_seconds"] == pytest.approx(7.0)
        clock.advance(7.0)
        await limiter.acquire()
    rows = sql(pg_dsn, pg_schema, "SELECT name, key, cardinality(hits) FROM trio_jobs_rate_limits")
    assert rows == [("pg.vendor", "", 2)]


async def test_the_retention_sweep_purges_passed_windows_and_keeps_the_current_one(
    pg_dsn: str, pg_schema: str, clock: FakeClock
) -> None:
    """A row whose last grant left its window and whose queue has passed holds
    nothing: the retention purge (the statement it runs anyway) deletes it. A
    row still counting grants, or promising places ahead, stays untouched."""
    old = rate_limiter("pg.old", limit=2, per="10s")
    queued = rate_limiter("pg.queued", limit=1, per="10s")
    current = rate_limiter("pg.current", limit=3, per="1m")
    driver = postgres_driver(pg_dsn, schema=pg_schema, clock=clock)
    async with open_jobs(driver):
        await old.acquire()
        await old.acquire(key="acct")
        await queued.acquire()
        for _ in range(3):  # three places promised: 10, 20 and 30 s from now
            with pytest.raises(JobsError):
                await queued.acquire()
        clock.advance(15.0)  # the 10 s windows have passed; the queue has not
        await current.acquire()
        await current.acquire()
        before = sql(
            pg_dsn, pg_schema, "SELECT * FROM trio_jobs_rate_limits WHERE name = 'pg.current'"
        )
        result = await purge_expired(driver)
        assert result.removed == 0  # no job rows: the count is the jobs'
        left = sql(pg_dsn, pg_schema, "SELECT name, key FROM trio_jobs_rate_limits ORDER BY 1, 2")
        assert left == [("pg.current", ""), ("pg.queued", "")]
        after = sql(
            pg_dsn, pg_schema, "SELECT * FROM trio_jobs_rate_limits WHERE name = 'pg.current'"
        )
        assert after == before  # the current window's count and queue untouched
        # the current window still counts its two grants: one more, then refused
        await current.acquire()
        with pytest.raises(JobsError):
            await current.acquire()
        clock.advance(16.0)  # the last place (30 s after the refusals) has passed
        await purge_expired(driver)
        left = sql(pg_dsn, pg_schema, "SELECT name FROM trio_jobs_rate_limits")
        assert left == [("pg.current",)]
        # a purged window starts afresh: the budget is whole again
        await old.acquire()
        await old.acquire()
    rows = sql(
        pg_dsn,
        pg_schema,
        "SELECT cardinality(hits) FROM trio_jobs_rate_limits WHERE name = 'pg.old'",
    )
    assert rows == [(2,)]


async def test_a_row_from_before_0010_is_kept_until_its_next_acquisition(
    pg_dsn: str, pg_schema: str, clock: FakeClock
) -> None:
    limiter = rate_limiter("pg.legacy", limit=1, per="10s")
    driver = postgres_driver(pg_dsn, schema=pg_schema, clock=clock)
    async with open_jobs(driver):
        sql(
            pg_dsn,
            pg_schema,
            "INSERT INTO trio_jobs_rate_limits (name, key, hits, granted, at) "
            "VALUES ('pg.legacy', '', ARRAY[%s::float8], true, %s)",
            (clock.now() - 3600, clock.now() - 3600),
        )
        await purge_expired(driver)
        assert sql(pg_dsn, pg_schema, "SELECT expires_at FROM trio_jobs_rate_limits") == [
            (float("inf"),)
        ]
        await limiter.acquire()  # the old hit left long ago: granted, and the row says its window
        clock.advance(10.0)
        await purge_expired(driver)
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_rate_limits") == [(0,)]


async def test_a_closed_driver_refuses_with_driver_unavailable(pg_dsn: str, pg_schema: str) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    await driver.open()
    await driver.close()
    assert driver.rate_limits is not None
    with pytest.raises(JobsError) as caught:
        await driver.rate_limits.acquire("pg.closed", "", 1, 1.0)
    assert caught.value.code == ErrorCode.X_DRIVER_UNAVAILABLE


@pytest.mark.slow
async def test_a_backlog_over_the_budget_runs_spread_and_never_over_it(
    pg_dsn: str, pg_schema: str
) -> None:
    """N runs over a budget of k per window, served by two workers on the
    database's clock: never more than k granted in any window (read from the
    store's own instants), every run started on its first attempt, and the
    refused spread over the windows to come rather than all due at the first
    freed slot."""
    limiter = rate_limiter("pg.spread", limit=3, per="2s")
    started: list[int] = []

    @job(input=Send, tenant="none", idempotency_key=lambda s: s.key, retry=Retry(attempts=1))
    async def metered(ctx: JobContext[Send]) -> None:
        await limiter.acquire()
        started.append(ctx.attempt)

    seen: set[float] = set()

    def read_hits() -> None:
        for (hits,) in sql(pg_dsn, pg_schema, "SELECT hits FROM trio_jobs_rate_limits"):
            seen.update(hits)

    driver = postgres_driver(pg_dsn, schema=pg_schema)
    async with open_jobs(driver, jobs=[metered]) as jobs:
        ids = [e.id for e in await metered.enqueue_many([Send(f"k{i}") for i in range(10)])]
        workers = [Worker(jobs, concurrency=4, poll_interval="50ms") for _ in range(2)]
        async with trio.open_nursery() as nursery:
            for worker in workers:
                await nursery.start(worker.run)
            with trio.fail_after(60):
                while len(started) < 10:
                    await trio.to_thread.run_sync(read_hits)
                    await trio.sleep(0.25)  # a quarter of the window: no grant is missed
            await trio.to_thread.run_sync(read_hits)
            for worker in workers:
                nursery.start_soon(worker.drain)
        views = [await jobs.show(i) for i in ids]
        logs = [await driver.attempt_log(i) for i in ids]
    assert {(v.state, v.attempts) for v in views} == {("done", 1)}
    assert started == [1] * 10
    hits = sorted(seen)
    assert len(hits) == 10
    for i in range(len(hits) - 3):
        assert hits[i + 3] - hits[i] >= 2.0 - 1e-6  # at most 3 in any 2 s
    deferred = [log for log in logs if any(a.outcome == "handed-back" for a in log)]
    assert len(deferred) >= 7  # the 7 that did not fit the first window waited uncounted
    for log in logs:
        assert {a.attempt for a in log} == {1}


# --------------------------------------------------------------------------- real processes


def _hammer(procs: RateProcs, tries: int) -> subprocess.Popen[bytes]:
    """A process that connects, says ``ready``, and acquires ``tries`` times on a
    line on its stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rate_jobs", "hammer", procs.dsn, str(tries)],
        env=procs._env(),
        cwd=procs.tmp,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready", proc.stderr
    return proc


@pytest.mark.slow
def test_two_processes_acquiring_at_once_share_one_budget(rate_procs: RateProcs) -> None:
    """Each process alone would be granted 30; together they are granted 30."""
    rate_procs.budget = {"RATE_LIMIT": "30", "RATE_PER": "1h"}
    both = [_hammer(rate_procs, 200) for _ in range(2)]
    for proc in both:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    granted = []
    for proc in both:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        granted.append(int(out.decode().strip()))
    assert sum(granted) == 30, granted
    assert min(granted) > 0, granted  # both spent the one budget


@pytest.mark.slow
def test_two_worker_processes_spend_one_budget_and_defer_the_rest_uncounted(
    rate_procs: RateProcs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    workers = [rate_procs.worker("--concurrency", "4") for _ in range(2)]
    keys = [f"k{i}" for i in range(30)]
    # Both processes up and claiming before the runs arrive: one that started
    # late would find the budget spent by the other, and the claim of both
    # (below) would rest on start-up timing.
    wait_until(
        lambda: sql(
            pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_workers HAVING count(*) >= 2"
        ),
        60,
        "both worker processes to register",
    )

    async def enqueue() -> None:
        async with open_jobs(postgres_driver(dsn), jobs=[rate_jobs.metered]):
            await rate_jobs.metered.enqueue_many([rate_jobs.Send(k) for k in keys])

    trio.run(enqueue)

    def settled() -> list[tuple[Any, ...]]:
        rows = sql(
            pg_dsn,
            pg_schema,
            "SELECT state, attempts, error_code, run_at - extract(epoch FROM clock_timestamp()) "
            "FROM trio_jobs_jobs WHERE state <> 'running'",
        )
        waiting = [r for r in rows if r[0] == "ready" and r[2] == ErrorCode.X_RATE_LIMITED]
        done = [r for r in rows if r[0] == "done"]
        return rows if len(waiting) + len(done) == len(keys) else []

    rows = wait_until(settled, 30, "every run done or deferred")
    done = [r for r in rows if r[0] == "done"]
    deferred = [r for r in rows if r[0] == "ready"]
    assert len(done) == 8  # one budget: not 8 per process
    assert {r[1] for r in done} == {1}
    assert len(deferred) == 22
    assert {r[1] for r in deferred} == {0}  # uncounted: not one attempt spent
    assert all(r[3] > 3000 for r in deferred)  # due when the hour's window frees
    effects = sql(pg_dsn, pg_schema, "SELECT count(*), count(DISTINCT key) FROM rate_effects")
    assert effects == [(8, 8)]
    claimed_by = sql(
        pg_dsn,
        pg_schema,
        "SELECT DISTINCT e ->> 'worker_id' FROM trio_jobs_jobs, jsonb_array_elements("
        "trio_jobs_attempt_view(attempt_log, attempts, attempt_worker, attempt_at, attempt_step,"
        " attempt_step_at, state, updated_at)) e",
    )
    assert len(claimed_by) == 2  # both processes claimed runs of the one budget
    for proc in workers:
        assert proc.poll() is None


@pytest.mark.slow
def test_the_worker_command_paces_each_tenant_per_process(
    rate_procs: RateProcs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    rate_procs.worker("--concurrency", "4", "--rate-per-tenant", "2/1h")
    orders = [rate_jobs.Order(f"a{i}", "acme") for i in range(4)]
    orders += [rate_jobs.Order(f"g{i}", "globex") for i in range(2)]

    async def enqueue() -> None:
        async with open_jobs(postgres_driver(dsn), jobs=[rate_jobs.tenanted]):
            await rate_jobs.tenanted.enqueue_many(orders)

    trio.run(enqueue)

    def settled() -> list[tuple[Any, ...]]:
        rows = sql(
            pg_dsn,
            pg_schema,
            "SELECT tenant_id, state, attempts, last_error FROM trio_jobs_jobs "
            "WHERE state IN ('done', 'ready') AND (state = 'done' OR error_code IS NOT NULL) "
            "ORDER BY tenant_id, state",
        )
        return rows if len(rows) == len(orders) else []

    rows = wait_until(settled, 30, "every order done or deferred")
    assert [(t, s, a) for t, s, a, _e in rows] == [
        ("acme", "done", 1),
        ("acme", "done", 1),
        ("acme", "ready", 0),
        ("acme", "ready", 0),
        ("globex", "done", 1),
        ("globex", "done", 1),
    ]
    assert all("rate_per_tenant" in e for t, s, _a, e in rows if s == "ready")
