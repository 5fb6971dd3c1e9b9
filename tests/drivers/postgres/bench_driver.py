"""Micro-benchmarks of the PostgreSQL driver (not collected by pytest).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \
        python tests/drivers/postgres/bench_driver.py

Prints medians: the bridge's per-call cost (``SELECT 1``) beside sync psycopg's,
``enqueue_many`` of 1,000, a single enqueue, claim+ack of one job, and a
claim of 100 then 100 concurrent acks.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid

import psycopg
import trio

from trio_jobs.drivers import AckOptions, ClaimOptions, EnqueueRequest
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._bridge import Database, Pool

DSN = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _req(key: str) -> EnqueueRequest:
    return EnqueueRequest(
        id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        name="bench",
        queue="default",
        payload={"key": key},
        idempotency_key=key,
        max_attempts=3,
    )


def _sync_select(n: int) -> float:
    with psycopg.connect(DSN, autocommit=True) as conn:
        for _ in range(200):
            conn.execute("SELECT 1").fetchall()
        start = time.perf_counter()
        for _ in range(n):
            conn.execute("SELECT 1").fetchall()
        return (time.perf_counter() - start) / n


async def _bridge_select(n: int, tasks: int) -> float:
    db = Database(Pool(DSN, max_size=max(1, min(tasks, 8))))
    for _ in range(200):
        await db.fetch("SELECT 1")

    async def loop() -> None:
        for _ in range(n // tasks):
            await db.fetch("SELECT 1")

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(loop)
    elapsed = (time.perf_counter() - start) / (n // tasks * tasks)
    await db.pool.close()
    return elapsed


async def _driver_numbers() -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    d = postgres_driver(DSN, schema=schema)
    await d.open()
    out: dict[str, float] = {}
    try:
        bulk = []
        for r in range(12):
            batch = [_req(f"b{r}-{i}") for i in range(1000)]
            start = time.perf_counter()
            await d.enqueue_many(batch)
            bulk.append(time.perf_counter() - start)
        out["enqueue_many(1000) ms"] = statistics.median(bulk[2:]) * 1e3
        single = []
        for i in range(300):
            start = time.perf_counter()
            await d.enqueue_many([_req(f"s{i}")])
            single.append(time.perf_counter() - start)
        out["enqueue(1) ms"] = statistics.median(single[50:]) * 1e3
        # drain what is queued so claim+ack measures one job at a time
        opts = ClaimOptions("bench", {"default": 1}, 30.0)
        pairs = []
        for _ in range(300):
            start = time.perf_counter()
            job = (await d.claim(opts)).jobs[0]
            await d.ack(job.id, AckOptions(fence=job.fence))
            pairs.append(time.perf_counter() - start)
        out["claim(1)+ack ms"] = statistics.median(pairs[50:]) * 1e3
        batch_opts = ClaimOptions("bench", {"default": 100}, 30.0)
        rounds = []
        for _ in range(10):
            start = time.perf_counter()
            jobs = (await d.claim(batch_opts)).jobs
            async with trio.open_nursery() as nursery:
                for job in jobs:
                    nursery.start_soon(d.ack, job.id, AckOptions(fence=job.fence))
            rounds.append((time.perf_counter() - start) / max(1, len(jobs)))
        out["claim(100)+100 acks, per job ms"] = statistics.median(rounds) * 1e3
    finally:
        await d.close()
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return out


async def main() -> None:
    n = 4000
    sync = _sync_select(n)
    one = await _bridge_select(n, 1)
    many = await _bridge_select(n, 16)
    print(f"SELECT 1, sync psycopg (no Trio):   {sync * 1e6:7.1f} us/call")
    print(
        f"SELECT 1, bridge, 1 task:           {one * 1e6:7.1f} us/call (+{(one - sync) * 1e6:.1f})"
    )
    print(f"SELECT 1, bridge, 16 tasks:         {many * 1e6:7.1f} us/call ({1 / many:,.0f}/s)")
    for name, value in (await _driver_numbers()).items():
        print(f"{name + ':':36s}{value:7.2f}")


if __name__ == "__main__":
    sys.exit(trio.run(main))
