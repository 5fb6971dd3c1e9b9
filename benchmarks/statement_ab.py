"""Statement shapes A/B, interleaved statement by statement: ``python -m benchmarks.statement_ab``.

    DATABASE_URL=... python -m benchmarks.statement_ab claim|ack ROWS STATEMENTS ROUNDS

One sync psycopg connection (prepared statements, as the driver on a direct
connection) on a throwaway schema of ready rows; each iteration runs a claim and
the ack of what it claimed, for every variant in turn (the order flips each
iteration), and the backend's CPU (``/proc/<pid>/schedstat``) is read around each
statement. ``claim`` compares claim variants (``cur``: the full reaping claim,
``ready``: ``claim_ready``, ``noreap``/``noseen``: the full claim less those CTEs,
``mini``: a graphile-shaped one-CTE claim); ``ack`` compares ack variants
(``cur``, ``nocount``, ``noagain``, ``nofreed``, ``one``: no id-order lock CTE,
``bare``). ``ONLY=a,b`` picks variants, ``SYNC=off`` turns ``synchronous_commit``
off in this session only (to see the commit's share). Medians, µs a statement.
"""

import json
import os
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
import trio

from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import _LAPSE_MESSAGE, LAPSED_LINE
from trio_jobs.drivers.postgres._sql import query

DSN = os.environ["DATABASE_URL"]


def cpu(pid):
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def cte_drop(sql, names):
    # drop named CTEs "name AS (" ... matching paren, plus the following comma
    for name in names:
        m = re.search(r"(,\s*)?(?:--[^\n]*\n\s*)*\b" + name + r" AS (?:MATERIALIZED )?\(", sql)
        assert m, name
        i = m.end()
        depth = 1
        while depth:
            c = sql[i]
            depth += c == "("
            depth -= c == ")"
            i += 1
        sql = sql[: m.start()] + sql[i:]
    return sql


CLAIM = query("claim")
ACK = query("ack_many")


def variants():
    v = {"claim": {}, "ack": {}}
    v["claim"]["cur"] = CLAIM
    v["claim"]["ready"] = query("claim_ready")
    noreap = cte_drop(CLAIM, ["reoffered", "buried", "freed", "counted"])
    noreap = noreap.replace(
        """UNION ALL
SELECT 'exhausted', b.id::text, b.run_id::text, b.name, b.queue, b.payload, b.tenant_id,
    NULL, NULL, b.attempts, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    b.state, b.error_code, b.last_error, NULL, NULL, NULL
FROM buried b
""",
        "",
    )
    v["claim"]["noreap"] = noreap
    v["claim"]["noseen"] = cte_drop(CLAIM, ["seen"]).replace(
        """UNION ALL
SELECT 'seen', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM seen
""",
        "",
    )
    v["claim"]["mini"] = """WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
p AS (SELECT j.id FROM trio_jobs_jobs j WHERE j.queue = (%(queues)s::text[])[1]
      AND j.state IN ('ready', 'delayed', 'suspended') AND j.run_at <= (SELECT now FROM n)
      ORDER BY j.priority, j.run_at, j.seq LIMIT (%(takes)s::int[])[1] FOR NO KEY UPDATE OF j SKIP LOCKED)
UPDATE trio_jobs_jobs j SET state = 'running', attempts = j.attempts + 1, worker_id = %(worker_id)s,
    claim = nextval('trio_jobs_claim_seq'), lease_expires_at = n.now + %(visibility)s, updated_at = n.now,
    attempt_at = n.now, attempt_worker = %(worker_id)s
FROM p, n WHERE j.id = p.id AND %(drop_names)s::text[] IS NOT NULL AND %(lapse_message)s::text IS NOT NULL AND %(lapsed_line)s::text IS NOT NULL AND (%(registry_ttl)s::float8 IS NULL OR true)
RETURNING 'job', j.id::text, j.run_id::text, j.name, j.queue, j.payload, j.tenant_id,
    j.idempotency_key, j.concurrency_key, j.attempts, j.max_attempts, j.worker_id, j.claim"""
    v["ack"]["cur"] = ACK
    v["ack"]["nocount"] = cte_drop(ACK, ["counted"])
    v["ack"]["noagain"] = cte_drop(ACK, ["again"]).replace(
        "UNION ALL\nSELECT ord, NULL FROM again", ""
    )
    v["ack"]["nofreed"] = cte_drop(ACK, ["freed"]).replace(
        "CASE WHEN EXISTS (SELECT 1 FROM freed f WHERE f.job_id = hit.id) THEN queue END", "NULL"
    )
    one = ACK
    a = one.index("-- The fenced rows, locked")
    b = one.index("hit AS (")
    one = one[:a] + one[b:]
    one = one.replace(
        """    FROM locked l, n
    WHERE j.id = l.id
    RETURNING j.id, j.name, j.queue, l.ord, l.duration, n.now""",
        """    FROM input l, n
    WHERE j.id = l.id AND j.state = 'running' AND j.worker_id = l.worker_id AND j.claim = l.claim
      AND j.lease_expires_at > n.now
    RETURNING j.id, j.name, j.queue, l.ord, l.duration, n.now""",
    )
    v["ack"]["one"] = one
    v["ack"]["bare"] = """WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),
input AS (SELECT * FROM json_to_recordset(%(rows)s::json) AS t(ord int, id uuid, worker_id text, claim int8, result text, progress text, duration float8, again boolean)),
locked AS MATERIALIZED (SELECT j.id, i.ord, i.result FROM input i JOIN trio_jobs_jobs j ON j.id = i.id
    WHERE j.state = 'running' AND j.worker_id = i.worker_id AND j.claim = i.claim AND j.lease_expires_at > (SELECT now FROM n)
    ORDER BY j.id FOR NO KEY UPDATE OF j)
UPDATE trio_jobs_jobs j SET state = 'done', result = l.result::json, worker_id = NULL, updated_at = n.now
FROM locked l, n WHERE j.id = l.id RETURNING l.ord, NULL"""
    return v


def main():
    which = sys.argv[1]  # claim or ack
    size = int(sys.argv[2])
    n = int(sys.argv[3])
    rounds = int(sys.argv[4])
    schema = f"bench_var_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')

    async def mk():
        d = postgres_driver(DSN, schema=schema, pool_size=1)
        await d.open()
        await d.close()

    trio.run(mk)
    try:
        conn = psycopg.connect(DSN, autocommit=True, prepare_threshold=0)
        conn.execute(f'SET search_path TO "{schema}"')
        now = time.time()
        total = size * n * rounds * 8 + 5000
        conn.execute(
            """INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, idempotency_key, max_attempts,
            state, run_at, created_at, updated_at, sensitive)
            SELECT gen_random_uuid(), gen_random_uuid(), 'bench.big', 'default', to_json(g),
            'ready:' || g, 3, 'ready', %(now)s - 1, %(now)s - 1, %(now)s - 1, false
            FROM generate_series(1, %(n)s) g""",
            {"now": now, "n": total},
        )
        conn.execute("VACUUM ANALYZE trio_jobs_jobs")
        if os.environ.get("SYNC"):
            conn.execute("SET synchronous_commit = " + os.environ["SYNC"])
        pid = conn.info.backend_pid
        wid = "w-" + uuid.uuid4().hex[:6]
        vs = variants()
        cp = dict(
            now=None,
            queues=["default"],
            takes=[size],
            worker_id=wid,
            visibility=60.0,
            drop_names=[],
            lapse_message=_LAPSE_MESSAGE,
            lapsed_line=LAPSED_LINE,
            registry_ttl=None,
        )

        def one(csql, asql, out_c, out_a):
            c0 = cpu(pid)
            rows = conn.execute(csql, cp, prepare=True).fetchall()
            c1 = cpu(pid)
            got = [r for r in rows if r[0] == "job"]
            ar = [
                {"ord": i, "id": r[1], "worker_id": r[11], "claim": r[12], "duration": 0.001}
                for i, r in enumerate(got, 1)
            ]
            a = conn.execute(asql, {"now": None, "rows": json.dumps(ar)}, prepare=True).fetchall()
            c2 = cpu(pid)
            assert len(a) == len(ar) == size, (len(a), len(ar))
            out_c.append(c1 - c0)
            out_a.append(c2 - c1)

        keys = [k for k in vs[which] if k in os.environ.get("ONLY", ",".join(vs[which])).split(",")]
        res = {k: [] for k in keys}

        def sqls(k):
            csql = vs["claim"][k] if which == "claim" else vs["claim"]["cur"]
            asql = vs["ack"][k] if which == "ack" else vs["ack"]["cur"]
            return csql, asql

        for _ in range(10):
            for k in keys:
                one(*sqls(k), [], [])
        for i in range(n * rounds):
            order = keys if i % 2 == 0 else keys[::-1]
            for k in order:
                oc, oa = [], []
                one(*sqls(k), oc, oa)
                res[k].append((oc if which == "claim" else oa)[0] / 1e3)
        print(
            f"{which} size {size} load {os.getloadavg()[0]:.1f} sync {os.environ.get('SYNC', 'on')}"
        )
        base = statistics.median(res[keys[0]])
        for k in keys:
            m = statistics.median(res[k])
            q = statistics.quantiles(res[k], n=4)
            print(f"  {k:10s} {m:7.0f} µs  ({m / base:.2f}x)  quartiles {q[0]:.0f}-{q[2]:.0f}")
    finally:
        with psycopg.connect(DSN, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


main()
