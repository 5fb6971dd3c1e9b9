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

from trio_jobs import ErrorCode, JobsError, open_jobs, rate_limiter
from trio_jobs.drivers.postgres import postgres_driver

from .conftest import FakeClock, sql
from .test_processes import Procs, wait_until
from .test_processes import dsn as dsn  # the fixture: the test's migrated schema

pytestmark = [pytest.mark.postgres]

rate_jobs = importlib.import_module("rate_jobs")


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


async def test_a_closed_driver_refuses_with_driver_unavailable(pg_dsn: str, pg_schema: str) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    await driver.open()
    await driver.close()
    assert driver.rate_limits is not None
    with pytest.raises(JobsError) as caught:
        await driver.rate_limits.acquire("pg.closed", "", 1, 1.0)
    assert caught.value.code == ErrorCode.X_DRIVER_UNAVAILABLE


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
        "SELECT DISTINCT e ->> 'worker_id' FROM trio_jobs_jobs, jsonb_array_elements(attempt_log) e",
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
