"""A batch of fresh inputs inserts through ``enqueue_fresh`` (migration 0032):
a plain INSERT in an exception block, without ON CONFLICT's probe of both
unique indexes before every row (benchmarks/README.md, "2026-12-03 (fourth
session)"). The first held key or known id rolls the block back and the batch
goes through enqueue_many, which names the holders: the answers, the rows and
the caller's transaction must be as if enqueue_many alone had run.
"""

from __future__ import annotations

import pytest

from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.postgres import PostgresDriver, _driver
from trio_jobs.drivers.postgres._sql import query

from .conftest import req, sql

pytestmark = pytest.mark.postgres


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the driver's enqueue statements, in the order they ran (a
    spy on the statement lookup; the statements still run on the real server)."""
    names: list[str] = []

    def spy(name: str) -> str:
        if name.startswith("enqueue"):
            names.append(name)
        return query(name)

    monkeypatch.setattr(_driver, "query", spy)
    return names


def _rows(pg_dsn: str, pg_schema: str) -> list[tuple[object, ...]]:
    return sql(
        pg_dsn,
        pg_schema,
        "SELECT idempotency_key, state, tenant_id, priority FROM trio_jobs_jobs ORDER BY seq",
    )


async def test_a_fresh_batch_is_one_statement_in_input_order(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str, sent: list[str]
) -> None:
    batch = [
        req("a", tenant_id="t1", priority=2),
        req("b", tenant_id="t2", delay=3600.0),
        req("c", tenant_id="t1"),
    ]
    out = await driver.enqueue_many(batch)
    assert sent == ["enqueue_fresh"]
    assert [(o.id, o.run_id, o.deduped) for o in out] == [(r.id, r.run_id, False) for r in batch]
    assert _rows(pg_dsn, pg_schema) == [
        ("a", "ready", "t1", 2),
        ("b", "delayed", "t2", 0),
        ("c", "ready", "t1", 0),
    ]


async def test_a_held_key_last_in_the_batch_leaves_no_half_batch(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str, sent: list[str]
) -> None:
    (held,) = await driver.enqueue_many([req("k9")])
    sent.clear()
    batch = [req(f"k{i}") for i in range(10)]  # k9 is held: the fresh insert fails last
    out = await driver.enqueue_many(batch)
    assert sent == ["enqueue_fresh", "enqueue_many"]
    assert [o.deduped for o in out] == [False] * 9 + [True]
    assert (out[9].id, out[9].run_id) == (held.id, held.run_id)
    assert [o.id for o in out[:9]] == [r.id for r in batch[:9]]
    keys = [k for k, *_ in _rows(pg_dsn, pg_schema)]
    assert keys == ["k9"] + [f"k{i}" for i in range(9)]


async def test_a_republished_batch_of_settled_rows_adds_none(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str, sent: list[str]
) -> None:
    # Settled, so their live keys are free: only the primary key tells.
    batch = [req("r1"), req("r2")]
    await driver.enqueue_many(batch)
    got = await driver.claim(ClaimOptions("w", {"default": 2}, 60.0))
    for job in got.jobs:
        assert await driver.ack(job.id, AckOptions(fence=job.fence))
    sent.clear()
    out = await driver.enqueue_many(batch)
    assert sent == ["enqueue_fresh", "enqueue_many"]
    assert [(o.id, o.deduped) for o in out] == [(r.id, True) for r in batch]
    assert _rows(pg_dsn, pg_schema) == [("r1", "done", None, 0), ("r2", "done", None, 0)]


async def test_a_held_key_inside_a_transaction_leaves_it_usable(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    (held,) = await driver.enqueue_many([req("x1")])
    async with driver.transaction() as tx:
        out = await tx.enqueue_many([req("x0"), req("x1"), req("x2")])
        # The failed fresh insert was a subtransaction: the transaction goes on.
        more = await tx.enqueue_many([req("x3"), req("x4")])
    assert [o.deduped for o in out] == [False, True, False]
    assert out[1].id == held.id
    assert [o.deduped for o in more] == [False, False]
    keys = sorted(k for k, *_ in _rows(pg_dsn, pg_schema))
    assert keys == ["x0", "x1", "x2", "x3", "x4"]


async def test_after_a_held_key_the_later_chunks_skip_the_fresh_try(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str, sent: list[str]
) -> None:
    await driver.enqueue_many([req("c0")])
    sent.clear()
    chunk = _driver.ENQUEUE_CHUNK
    out = await driver.enqueue_many([req(f"c{i}") for i in range(chunk + 2)])
    assert sent == ["enqueue_fresh", "enqueue_many", "enqueue_many"]
    assert [o.deduped for o in out].count(True) == 1
    (count,) = sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs")[0]
    assert count == chunk + 2
