"""``enqueue_many`` of 1,000 fresh inputs through the facade: ``python -m benchmarks.enqueue_many_cpu``.

    DATABASE_URL=... python -m benchmarks.enqueue_many_cpu [CALLS]

A one-connection driver on a throwaway schema; ``pg_noop.enqueue_many`` of
1,000 new inputs, CALLS times after 3 warm-ups; the server backend's CPU
(``/proc/<pid>/schedstat``) and the client's (``time.process_time``) around
each call, medians. Alternate trees with ``PYTHONPATH=<tree>/src``.
"""

import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
import trio

import trio_jobs
from trio_jobs import JobContext, job, open_jobs
from trio_jobs.drivers.postgres import postgres_driver

DSN = os.environ["DATABASE_URL"]
calls = int(sys.argv[1]) if len(sys.argv) > 1 else 10


@job(input=int, idempotency_key=lambda i: f"noop:{i}", name="bench.pg.noop")
async def pg_noop(ctx: JobContext[int]) -> None:
    return None


def cpu(pid):
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def main():
    schema = f"e2e_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
    try:
        d = postgres_driver(DSN, schema=schema, pool_size=1)
        async with open_jobs(d, jobs=[pg_noop]):
            ((pid,),) = await d.db.fetch("SELECT pg_backend_pid()", None)
            base = 0
            srv, cli = [], []
            for i in range(calls + 3):
                inputs = range(base, base + 1000)
                base += 1000
                s0, c0 = cpu(pid), time.process_time()
                await pg_noop.enqueue_many(inputs)
                s1, c1 = cpu(pid), time.process_time()
                if i >= 3:
                    srv.append((s1 - s0) / 1e6)
                    cli.append((c1 - c0) * 1e3)
            print(
                f"{trio_jobs.__file__.split('/src/')[0]}: server {statistics.median(srv):.2f} ms client {statistics.median(cli):.2f} ms a call (median of {calls}), load {os.getloadavg()[0]:.1f}"
            )
    finally:
        with psycopg.connect(DSN, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')


trio.run(main)
