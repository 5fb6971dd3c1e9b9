"""``enqueue_many``'s statement shapes A/B, interleaved: ``python -m benchmarks.enqueue_ab``.

    DATABASE_URL=... ONLY=many,fresh python -m benchmarks.enqueue_ab [ROWS] [STATEMENTS]

Each variant gets a throwaway schema of its own (the driver's migrations, then
``PRE`` rows, default 100,000, a tenth of them ready) and a sync psycopg
connection (prepared, as the driver on a direct connection); the variants run
one statement each in turn (the order flips every iteration), each a batch of
``ROWS`` fresh inputs built by the driver's own ``_enqueue_params``, and the
backend's CPU (``/proc/<pid>/schedstat``) is read around each statement.
Variants: ``many`` (enqueue_many: ``ON CONFLICT DO NOTHING``), ``fresh``
(enqueue_fresh, migration 0032), ``noconf`` (enqueue_many without ``ON
CONFLICT``: the floor, unsafe), ``target`` (``ON CONFLICT`` on the live-key
index alone); a trailing ``7`` (``many7``) feeds the variant uuid v7 ids.
Medians, ms a statement.
"""

import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
import trio

from trio_jobs.drivers import EnqueueRequest
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._sql import query

DSN = os.environ["DATABASE_URL"]
MANY = query("enqueue_many")
LIVE = (
    "(name, idempotency_key, tenant_id) WHERE state IN ('ready', 'delayed', 'running', 'suspended')"
)
VARIANTS = {
    "many": MANY,
    "fresh": query("enqueue_fresh"),
    "noconf": MANY.replace("ON CONFLICT DO NOTHING", ""),
    "target": MANY.replace("ON CONFLICT DO NOTHING", f"ON CONFLICT {LIVE} DO NOTHING"),
}


def cpu(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def uuid7() -> str:
    ms = int(time.time() * 1000)
    r = int.from_bytes(os.urandom(10))
    v = (ms << 80) | (0x7 << 76) | ((r >> 62) & 0xFFF) << 64 | (0b10 << 62) | (r & ((1 << 62) - 1))
    return str(uuid.UUID(int=v))


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    pre = int(os.environ.get("PRE", "100000"))
    keys = os.environ.get("ONLY", "many,fresh").split(",")
    schemas = {k: f"enqab_{k}_{uuid.uuid4().hex[:6]}" for k in keys}
    with psycopg.connect(DSN, autocommit=True) as c:
        for s in schemas.values():
            c.execute(f'CREATE SCHEMA "{s}"')

    async def migrate(schema: str) -> None:
        d = postgres_driver(DSN, schema=schema, pool_size=1)
        await d.open()
        await d.close()

    for s in schemas.values():
        trio.run(migrate, s)
    builder = postgres_driver(DSN, schema="unused")  # never opened: builds parameters
    builder._notify_allowed = lambda queues: []  # type: ignore[method-assign]
    count = 0

    def batch(v7: bool) -> dict[str, object]:
        nonlocal count
        out = []
        for _ in range(rows):
            count += 1
            out.append(
                EnqueueRequest(
                    id=uuid7() if v7 else str(uuid.uuid4()),
                    run_id=str(uuid.uuid4()),
                    name="bench.pg.noop",
                    queue="default",
                    payload=count,
                    idempotency_key=f"noop:{count}",
                    max_attempts=3,
                )
            )
        return {**builder._enqueue_params(out, range(len(out))), "now": None}

    conns = {}
    try:
        for k, s in schemas.items():
            c = psycopg.connect(DSN, autocommit=True, prepare_threshold=0)
            c.execute(f'SET search_path TO "{s}"')
            c.execute(
                """INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, idempotency_key,
                max_attempts, state, run_at, created_at, updated_at, sensitive)
                SELECT gen_random_uuid(), gen_random_uuid(), 'bench.big', 'default', to_json(g),
                'pre:' || g, 3, CASE WHEN mod(g, 10) = 0 THEN 'ready' ELSE 'done' END, 1, 1, 1,
                false FROM generate_series(1, %(n)s) g""",
                {"n": pre},
            )
            c.execute("VACUUM ANALYZE trio_jobs_jobs")
            conns[k] = c
        res: dict[str, list[float]] = {k: [] for k in keys}
        for it in range(iters + 3):
            for k in keys if it % 2 == 0 else keys[::-1]:
                c = conns[k]
                params = batch(k.endswith("7"))
                pid = c.info.backend_pid
                c0 = cpu(pid)
                got = c.execute(VARIANTS[k.rstrip("7")], params, prepare=True).fetchall()
                c1 = cpu(pid)
                assert len(got) == 1, got[:3]  # every input inserted
                if it >= 3:
                    res[k].append((c1 - c0) / 1e6)
        print(f"rows {rows} pre {pre} load {os.getloadavg()[0]:.1f}")
        base = statistics.median(res[keys[0]])
        for k in keys:
            m = statistics.median(res[k])
            q = statistics.quantiles(res[k], n=4)
            print(f"  {k:8s} {m:7.2f} ms ({m / base:.2f}x)  quartiles {q[0]:.2f}-{q[2]:.2f}")
    finally:
        for c in conns.values():
            c.close()
        with psycopg.connect(DSN, autocommit=True) as c:
            for s in schemas.values():
                c.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')


main()
