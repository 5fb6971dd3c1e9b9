"""A parent gathering no-op children on PostgreSQL, beside the same fan-out by hand.

    python -m benchmarks children [--dsn DSN] [--children 1000] [--rounds 3] [--slots 50]
    python -m benchmarks children --trigger-cost [--rounds 24]

Built-in: a parent's ``step.gather`` of ``--children`` no-op children (the
children enqueued in the transaction that records the step; the parent
suspended, made due by its last child's settle; results read in order).

By hand (the issue's peer): the parent's ``step.transaction`` inserts a counter
row of its own and ``enqueue_many``-s the children in the same transaction, then
``wait_for_event``-s; each child's ``step.transaction`` counts the row down and
the child that reaches zero publishes the event in that transaction.

Each run is timed from the parent's first start to its resume (the first line
after the gather or the wait), in one process with one worker of ``--slots``
slots, the two kinds alternated ``--rounds`` times in one schema. Reported: each
run, the median of each kind, the ratio hand/built-in (above 1.0 the built-in
is faster), and the statements per child: every named statement the driver
sent during the run (its ``query()`` calls) and every app statement of a
``step.transaction`` (the hand-built counter's), divided by the children;
BEGIN/COMMIT and the benchmark's own ``show`` reads are not counted.

``--trigger-cost`` measures instead what the child triggers (migration 0018)
cost rows that are no children: one ``UPDATE`` settling 3,000 running rows,
per row, with the triggers enabled and disabled, alternated ``--rounds`` times.

The database is ``--dsn``, else ``$DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the run works in a fresh schema
of it, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs import JobContext, Worker, job, open_jobs, publish_event
from trio_jobs.drivers.postgres import _driver as pg_driver
from trio_jobs.drivers.postgres import migrate, postgres_driver

#: When each parent run first started and first resumed (time.monotonic()).
STARTED: dict[str, float] = {}
RESUMED: dict[str, float] = {}
SENT: Counter[str] = Counter()


@attrs.frozen
class Fan:
    tag: str
    n: int


@attrs.frozen
class Part:
    tag: str
    i: int


@job(input=Part, idempotency_key=lambda p: f"{p.tag}:{p.i}", name="bench.child")
async def child(ctx: JobContext[Part]) -> int:
    return ctx.input.i


@job(input=Fan, idempotency_key=lambda f: f.tag, name="bench.gather", event_poll="1h")
async def gather_parent(ctx: JobContext[Fan]) -> int:
    STARTED.setdefault(ctx.input.tag, time.monotonic())
    got = await ctx.step.gather(
        "all", [(child, Part(ctx.input.tag, i)) for i in range(ctx.input.n)]
    )
    RESUMED.setdefault(ctx.input.tag, time.monotonic())
    return len(got)


@job(input=Part, idempotency_key=lambda p: f"{p.tag}:{p.i}", name="bench.hand_child")
async def hand_child(ctx: JobContext[Part]) -> int:
    tag = ctx.input.tag

    async def count(tx: Any) -> int:
        rows = await tx.execute(
            "UPDATE bench_fanin SET remaining = remaining - 1 WHERE tag = %s RETURNING remaining",
            (tag,),
        )
        if rows[0][0] == 0:
            await publish_event(f"fanin:{tag}", {"tag": tag})
        return int(rows[0][0])

    await ctx.step.transaction("count", count)
    return ctx.input.i


@job(input=Fan, idempotency_key=lambda f: f.tag, name="bench.hand", event_poll="1h")
async def hand_parent(ctx: JobContext[Fan]) -> int:
    tag, n = ctx.input.tag, ctx.input.n
    STARTED.setdefault(tag, time.monotonic())

    async def fan_out(tx: Any) -> None:
        await tx.execute("INSERT INTO bench_fanin (tag, remaining) VALUES (%s, %s)", (tag, n))
        await hand_child.enqueue_many([Part(tag, i) for i in range(n)])

    await ctx.step.transaction("fan", fan_out)
    await ctx.step.wait_for_event("done", f"fanin:{tag}", schema=dict, timeout="1h")
    RESUMED.setdefault(tag, time.monotonic())
    return n


def _scoped(dsn: str, schema: str) -> str:
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c search_path={schema}".strip()
    return make_conninfo("", **params)


def _counting() -> None:
    """Count every named statement the driver sends."""
    real = pg_driver.query

    def query(name: str) -> str:
        SENT[name] += 1
        return real(name)

    pg_driver.query = query  # type: ignore[assignment]
    execute = pg_driver._PgTx.execute

    async def app_sql(self: Any, sql: str, params: Any = ()) -> Any:
        SENT["app sql"] += 1
        return await execute(self, sql, params)

    pg_driver._PgTx.execute = app_sql  # type: ignore[method-assign]


async def _runs(dsn: str, schema: str, n: int, rounds: int, slots: int) -> list[dict[str, Any]]:
    driver = postgres_driver(dsn, schema=schema)
    out: list[dict[str, Any]] = []
    async with open_jobs(driver, jobs=[gather_parent, child, hand_parent, hand_child]) as jobs:
        worker = Worker(jobs, concurrency={"default": slots}, poll_interval="1s")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            for r in range(rounds):
                for kind, parent in (("built-in", gather_parent), ("by hand", hand_parent)):
                    tag = f"{kind[:4]}-{r}-{uuid.uuid4().hex[:6]}"
                    SENT.clear()
                    enq = await parent.enqueue(Fan(tag, n))
                    with trio.fail_after(600):
                        while tag not in RESUMED:  # noqa: ASYNC110 — polled, bounded
                            await trio.sleep(0.005)
                        while (await jobs.show(enq.id)).state != "done":  # noqa: ASYNC110
                            await trio.sleep(0.02)
                    await trio.sleep(0.2)  # the last heartbeats and settles of the round
                    # the benchmark's own reads of the parent are not the run's
                    sent = sum(v for k, v in SENT.items() if not k.startswith("show"))
                    out.append(
                        {
                            "kind": kind,
                            "round": r,
                            "seconds": RESUMED[tag] - STARTED[tag],
                            "statements": sent,
                            "by_name": dict(SENT.most_common(8)),
                        }
                    )
            await worker.drain()
    return out


TRIGGERS = ("trio_jobs_jobs_child_note", "trio_jobs_jobs_child_flush")


def trigger_cost(dsn: str, schema: str, rounds: int, rows: int = 3_000) -> dict[str, list[float]]:
    """Microseconds a row of one settle of ``rows`` non-child rows, triggers on and off."""
    trio.run(lambda: migrate(dsn, schema=schema))
    out: dict[str, list[float]] = {"on": [], "off": []}
    with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
        for r in range(rounds):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                verb = "ENABLE" if mode == "on" else "DISABLE"
                for trigger in TRIGGERS:
                    conn.execute(f"ALTER TABLE trio_jobs_jobs {verb} TRIGGER {trigger}".encode())
                queue = f"q{r}{mode}"
                conn.execute(
                    "INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, "
                    "idempotency_key, max_attempts, priority, state, run_at, created_at, "
                    "updated_at) SELECT gen_random_uuid(), gen_random_uuid(), 'n', %s, '{}', "
                    "g::text, 1, 0, 'running', 0, 0, 0 FROM generate_series(1, %s) g",
                    (queue, rows),
                )
                started = time.perf_counter()
                conn.execute(
                    "UPDATE trio_jobs_jobs SET state = 'done', updated_at = 1 WHERE queue = %s",
                    (queue,),
                )
                out[mode].append((time.perf_counter() - started) / rows * 1e6)
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks children")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--children", type=int, default=1_000, help="Children per parent.")
    parser.add_argument("--rounds", type=int, default=3, help="Runs of each kind, alternated.")
    parser.add_argument("--slots", type=int, default=50, help="The worker's slots.")
    parser.add_argument(
        "--trigger-cost", action="store_true", help="The triggers' cost on non-child settles."
    )
    args = parser.parse_args(list(argv))
    schema = f"tjbench_children_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        admin.execute(
            f'CREATE TABLE "{schema}".bench_fanin (tag text PRIMARY KEY, remaining int NOT NULL)'
        )
    if args.trigger_cost:
        try:
            cost = trigger_cost(args.dsn, schema, args.rounds)
        finally:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        on, off = statistics.median(cost["on"]), statistics.median(cost["off"])
        print(f"settling 3,000 non-child rows in one UPDATE, {args.rounds} rounds alternated:")
        print(f"triggers on {on:.1f} us a row, off {off:.1f} us a row (median): {on / off:.3f}x")
        return 0
    _counting()
    try:
        runs = trio.run(_runs, args.dsn, schema, args.children, args.rounds, args.slots)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    n = args.children
    print(f"{n} no-op children per parent, one worker of {args.slots} slots, {args.rounds} rounds")
    print()
    print("| run | kind | start to resume | statements | per child |")
    print("|---:|---|---:|---:|---:|")
    for r in runs:
        print(
            f"| {r['round']} | {r['kind']} | {r['seconds'] * 1000:,.0f} ms | "
            f"{r['statements']:,} | {r['statements'] / n:.2f} |"
        )
    built = statistics.median(r["seconds"] for r in runs if r["kind"] == "built-in")
    hand = statistics.median(r["seconds"] for r in runs if r["kind"] == "by hand")
    per_b = statistics.median(r["statements"] / n for r in runs if r["kind"] == "built-in")
    per_h = statistics.median(r["statements"] / n for r in runs if r["kind"] == "by hand")
    print()
    print(
        f"median start to resume: built-in {built * 1000:,.0f} ms, by hand {hand * 1000:,.0f} ms: "
        f"**{hand / built:.2f}x** (target >= 1.0x); statements per child: built-in {per_b:.2f}, "
        f"by hand {per_h:.2f}"
    )
    for kind in ("built-in", "by hand"):
        last = [r for r in runs if r["kind"] == kind][-1]
        print(f"{kind}, last run's statements by name: {last['by_name']}")
    return 0
