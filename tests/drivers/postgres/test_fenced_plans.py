"""A fenced write reads its own rows, not the fleet's.

Acks, heartbeats and step records find each request's job row by primary key
(sql/queue.sql, ack_many). Written as a join of the requests to the running
rows, their generic plan (the driver prepares them on a direct connection) read
the lease index instead: every running row of every worker, hashed, per
statement, so a batch of 8 acks cost what the fleet held (3.4 ms at 4,000
running rows, 9.9 ms at 16,000; a heartbeat of 64 rows 163 ms) and the fleet
curve bent with the processes (benchmarks/README.md, "The fenced statements by
primary key").

Here the statistics are stale the way a busy table's are (analysed while
nothing ran), 3,000 rows run under another worker beside 50,000 settled ones, and each statement's generic
plan, run by ``EXPLAIN ANALYZE EXECUTE``, may read no more job rows than it was
asked about: a plan that scans the running rows reads thousands. The claim is
held to the same (it reads the waiting rows it takes, and their keys).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql as S

from trio_jobs.drivers import AckOptions, ClaimOptions, Fence, HeartbeatRequest
from trio_jobs.drivers.postgres import PostgresDriver
from trio_jobs.drivers.postgres._sql import positional

from .conftest import fill, req, sql

pytestmark = [pytest.mark.postgres, pytest.mark.server_side]

OTHERS = 3_000
HISTORY = 50_000  # settled rows: a table with a past, as every production one has
MINE = 8


def _rows_read(plan: dict[str, Any]) -> tuple[int, str]:
    """The most job-table rows any one node of ``plan`` read (answered, or
    removed by its filter), over all its loops, and that node."""
    most = (0, "")
    if plan.get("Relation Name") == "trio_jobs_jobs":
        loops = plan.get("Actual Loops", 1)
        rows = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
        most = (rows, f"{plan['Node Type']} {plan.get('Index Name', '')}, {loops} loops")
    for child in plan.get("Plans", ()):
        most = max(most, _rows_read(child))
    return most


def _generic_plan(dsn: str, schema: str, name: str, values: dict[str, Any]) -> dict[str, Any]:
    text, names = positional(name)
    with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
        conn.execute("BEGIN")
        try:
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            conn.execute(f"PREPARE fenced AS {text}")
            args = S.SQL(", ").join(S.Literal(values.get(n)) for n in names)
            explain = S.SQL("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE fenced({})")
            found = conn.execute(explain.format(args)).fetchone()
        finally:
            conn.execute("ROLLBACK")
    assert found is not None
    got = found[0]
    plan: dict[str, Any] = (json.loads(got) if isinstance(got, str) else got)[0]["Plan"]
    return plan


async def test_fenced_writes_read_only_the_rows_they_name(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    fill(pg_dsn, pg_schema, OTHERS, state="ready", name="busy", queue="elsewhere")
    fill(pg_dsn, pg_schema, HISTORY, state="done", name="old", queue="history")
    # analysed while nothing runs, then the crowd starts running: stale statistics
    sql(
        pg_dsn,
        pg_schema,
        "ANALYZE trio_jobs_jobs; UPDATE trio_jobs_jobs SET state = 'running', "
        "worker_id = 'other', claim = 1, lease_expires_at = 4e9 WHERE queue = 'elsewhere'",
    )
    await driver.enqueue_many([req(f"mine{i}") for i in range(MINE)])
    held = (await driver.claim(ClaimOptions("w1", {"default": MINE}, 30.0))).jobs
    assert len(held) == MINE
    acks = json.dumps(
        [
            {
                "ord": i,
                "id": c.id,
                "worker_id": c.fence.worker_id,
                "claim": c.fence.claim,
                "duration": 0.1,
                "again": False,
            }
            for i, c in enumerate(held)
        ]
    )
    steps = json.dumps(
        [
            {
                "ord": i,
                "job_id": c.id,
                "worker_id": c.fence.worker_id,
                "claim": c.fence.claim,
                "name": "s",
                "status": "completed",
                "seq": 1,
                "executions": 1,
                "output": "1",
            }
            for i, c in enumerate(held)
        ]
    )
    beats = {
        "ids": [c.id for c in held],
        "worker_ids": [c.fence.worker_id for c in held],
        "claims": [c.fence.claim for c in held],
        "progress": [None] * MINE,
        "steps": [None] * MINE,
        "step_since": [None] * MINE,
        "visibility": 30.0,
    }
    # more waiting rows than the claim asks for: it reads what it takes
    await driver.enqueue_many([req(f"next{i}") for i in range(2 * MINE)])
    claim = {
        "queues": ["default"],
        "takes": [MINE],
        "worker_id": "w2",
        "visibility": 30.0,
        "registry_ttl": None,
    }
    for name, values in (
        ("claim_ready", claim),
        ("ack_many", {"rows": acks}),
        ("ack_many_unkept", {"rows": acks}),
        ("heartbeat", beats),
        ("steps_put_many", {"rows": steps}),
    ):
        plan = _generic_plan(pg_dsn, pg_schema, name, values)
        rows, node = _rows_read(plan)
        assert rows <= MINE, f"{name}: {node} read {rows} job rows for {MINE} requests"
    # and, run for real, they still fence as they did: the worker's own rows
    # renew and settle, and a row under another claim is not touched
    assert (
        await driver.heartbeat([HeartbeatRequest(c.id, c.fence) for c in held], 30.0)
        == ["ok"] * MINE
    )
    for c in held:
        assert await driver.ack(c.id, AckOptions(fence=c.fence))
    other = sql(
        pg_dsn, pg_schema, "SELECT id::text FROM trio_jobs_jobs WHERE queue = 'elsewhere' LIMIT 1"
    )
    stranger = Fence(worker_id="w1", claim=held[0].fence.claim)
    assert not await driver.ack(str(other[0][0]), AckOptions(fence=stranger))
    assert sql(
        pg_dsn,
        pg_schema,
        "SELECT count(*) FROM trio_jobs_jobs WHERE queue = 'elsewhere' AND state = 'running' "
        "AND worker_id = 'other'",
    ) == [(OTHERS,)]
