"""The worker registry rides on the claim: an idle worker's unchanged record
costs no statement, and the row stays as fresh as that write would make it."""

from __future__ import annotations

import pytest

from trio_jobs.drivers import ClaimOptions, WorkerInfo
from trio_jobs.drivers.postgres import PostgresDriver

from .conftest import FakeClock, sql

pytestmark = pytest.mark.postgres

TTL = 30.0


def _info(in_flight: tuple[str, ...] = ()) -> WorkerInfo:
    return WorkerInfo(
        id="wk1",
        host="h",
        pid=1,
        started_at=1.0,
        queues=["default"],
        slots={"default": 4},
        in_flight=in_flight,
    )


def _row(dsn: str, schema: str) -> tuple[float, float, list[str]] | None:
    rows = sql(
        dsn,
        schema,
        "SELECT last_heartbeat, expires_at, in_flight FROM trio_jobs_workers WHERE id = 'wk1'",
    )
    if not rows:
        return None
    beat, expires, in_flight = rows[0]
    return float(beat), float(expires), list(in_flight)  # type: ignore[arg-type, call-overload]


async def test_an_idle_workers_unchanged_record_rides_on_its_claims(
    clocked: PostgresDriver, clock: FakeClock, pg_dsn: str, pg_schema: str
) -> None:
    intro = clocked.introspect
    assert intro is not None
    t0 = clock.now()
    await intro.record_worker(_info(), TTL)
    assert _row(pg_dsn, pg_schema) == (t0, t0 + TTL, [])

    # An empty claim by that worker renews the live row.
    clock.advance(5)
    assert (await clocked.claim(ClaimOptions("wk1", {"default": 4}, TTL))).jobs == []
    assert _row(pg_dsn, pg_schema) == (t0 + 5, t0 + 5 + TTL, [])

    # The same info, renewed less than half a ttl ago: no write.
    clock.advance(5)
    await intro.record_worker(_info(), TTL)
    assert _row(pg_dsn, pg_schema) == (t0 + 5, t0 + 5 + TTL, [])

    # New info writes at once.
    await intro.record_worker(_info(("j1",)), TTL)
    assert _row(pg_dsn, pg_schema) == (t0 + 10, t0 + 10 + TTL, ["j1"])

    # No claim for half a ttl: the unchanged record writes again.
    clock.advance(TTL / 2)
    await intro.record_worker(_info(("j1",)), TTL)
    assert _row(pg_dsn, pg_schema) == (t0 + 10 + TTL / 2, t0 + 10 + TTL * 1.5, ["j1"])

    # A claim by another worker renews nothing of wk1's.
    clock.advance(1)
    await clocked.claim(ClaimOptions("wk2", {"default": 4}, TTL))
    assert _row(pg_dsn, pg_schema) == (t0 + 10 + TTL / 2, t0 + 10 + TTL * 1.5, ["j1"])


async def test_an_expired_row_is_written_back_not_renewed(
    clocked: PostgresDriver, clock: FakeClock, pg_dsn: str, pg_schema: str
) -> None:
    intro = clocked.introspect
    assert intro is not None
    await intro.record_worker(_info(), TTL)
    clock.advance(TTL + 1)
    assert await intro.workers() == []  # the expired row leaves
    await clocked.claim(ClaimOptions("wk1", {"default": 4}, TTL))
    assert _row(pg_dsn, pg_schema) is None  # a claim never resurrects it
    await intro.record_worker(_info(), TTL)
    assert [w.id for w in await intro.workers()] == ["wk1"]
    await intro.remove_worker("wk1")
    assert await intro.workers() == []
