"""Child jobs keep the one lock order: no settle of children deadlocks another.

A batched settle (``ack_many``) may settle children of many parents at once.
The version of child jobs held back last session counted each parent down
from a row trigger, so a statement locked parents in the order it happened to
write its child rows, and two such statements could lock two parents in
opposite orders. Now every child notes its wait and the statement's first
AFTER trigger takes all of them, sorted by id (migration 0018).

Two OS processes (lock_stress.py's ``children`` mix) run children of 8 parents with 600
children each for a few seconds, over shuffled batched acks, burials, retries,
heartbeats, cancels of parents (their live children with them) and removals
of waiting children. The server says how many deadlocks it saw (its log on a
throwaway cluster, and ``pg_stat_database``), and every wait's count must
match its live children, every parent whose children all settled must be due.
It runs with the shipped flush, and with the flush slowed by a pause after
each wait it locks (a wide window for two settles to meet). A probe then runs
two settles of two waits in opposite orders on purpose: with the waits taken
as written (the held-back design's order) the server finds a deadlock, with
them taken by id it does not.
"""

from __future__ import annotations

import random
import threading
import uuid
from pathlib import Path

import orjson
import psycopg
import pytest
import trio

from trio_jobs.drivers import ClaimOptions, EnqueueRequest, NackOptions, StepRecord
from trio_jobs.drivers.postgres import migrate, postgres_driver
from trio_jobs.drivers.postgres._sql import migrations

from . import lock_stress
from .cluster import Cluster
from .lock_stress import deadlocks, explain, own_database

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.server_side]

PARENTS = 8
CHILDREN = 600
SLOTS = 120
SECONDS = 6.0


def _setup(dsn: str) -> list[str]:
    """PARENTS parents, each suspended on a gather of CHILDREN children, made
    the way a worker makes them: claimed, children enqueued in the transaction
    that records the step, handed back on the wait."""

    rng = random.Random(7)

    async def go() -> list[str]:
        await migrate(dsn)
        d = postgres_driver(dsn, migrate=False)
        await d.open()
        try:
            await d.enqueue_many(
                [
                    EnqueueRequest(
                        id=str(uuid.uuid4()),
                        run_id=str(uuid.uuid4()),
                        name="parent",
                        queue="parents",
                        payload={"i": i},
                        idempotency_key=f"p{i}",
                        max_attempts=5,
                    )
                    for i in range(PARENTS)
                ]
            )
            claimed = await d.claim(ClaimOptions("setup", {"parents": PARENTS}, 600.0))
            assert len(claimed.jobs) == PARENTS
            for p in claimed.jobs:
                kids = [str(uuid.uuid4()) for _ in range(CHILDREN)]
                async with d.transaction() as tx:
                    await tx.enqueue_many(
                        [
                            EnqueueRequest(
                                id=k,
                                run_id=str(uuid.uuid4()),
                                name=f"kid{n % 3}",
                                queue="kids",
                                payload={"n": n},
                                idempotency_key=f"{p.run_id}:all:{n}",
                                max_attempts=1_000,
                                # claims mix every parent's children
                                priority=rng.randrange(100),
                                parent_id=p.id,
                                parent_wait=kids[0],
                            )
                            for n, k in enumerate(kids)
                        ]
                    )
                    record = StepRecord("all", "waiting", 0, 1, {"children": kids, "wait": kids[0]})
                    assert await tx.put_step(p.id, p.fence, record)
                handback = NackOptions(
                    p.fence,
                    "suspended",
                    counted=False,
                    delay=3600.0,
                    wait_children=True,
                    children_wait=kids[0],
                )
                assert await d.nack(p.id, handback)
            return [p.id for p in claimed.jobs]
        finally:
            await d.close()

    return trio.run(go)


def _stress(dsn: str, tmp: Path) -> list[dict[str, int]]:
    """Two ``children`` load processes against ``dsn`` for SECONDS; what each did."""
    parents = _setup(dsn)
    return lock_stress.stress("children", dsn, tmp, SECONDS, SLOTS, FLOORS, orjson.dumps(parents))


#: What each load process must have done for the stress to prove anything.
FLOORS = {"claim": 20, "ack": 200, "bury": 20, "heartbeat": 5}


def _check_busy(did: list[dict[str, int]]) -> None:
    print(did)
    for counts in did:
        for what, least in FLOORS.items():
            assert counts.get(what, 0) >= least, (what, counts)
    assert sum(c.get("cancel", 0) for c in did) >= 2, did


def _check_counts(dsn: str) -> None:
    """Every wait counts exactly its live children; a parent with no wait left
    is due (or cancelled); the stress settled most children."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        wrong = conn.execute(
            "SELECT w.id, w.pending, (SELECT count(*) FROM trio_jobs_jobs c "
            "  WHERE c.parent_wait = w.id AND c.state IN ('ready','delayed','running','suspended'))"
            " FROM trio_jobs_child_waits w"
        ).fetchall()
        assert all(pending == live for _w, pending, live in wrong), wrong
        stuck = conn.execute(
            "SELECT p.id, p.state, p.run_at - trio_jobs_now() FROM trio_jobs_jobs p "
            "WHERE p.queue = 'parents' AND p.state <> 'cancelled' "
            "AND NOT EXISTS (SELECT 1 FROM trio_jobs_child_waits w WHERE w.parent_id = p.id) "
            "AND p.run_at > trio_jobs_now()"
        ).fetchall()
        assert stuck == [], stuck
        settled = conn.execute(
            "SELECT count(*) FROM trio_jobs_jobs WHERE queue = 'kids' AND parent_wait IS NULL"
        ).fetchone()
        assert settled is not None
        assert settled[0] > PARENTS * CHILDREN // 2, settled


def _flush(*, sorted_: bool, pause: float) -> str:
    """The shipped flush, rewritten: its waits taken in the order the statement
    wrote their children (as the held-back design locked parents) rather than
    by id, and/or with a 20 ms pause after each wait it locks, which widens the
    window in which two settles hold one wait each (so an order that can
    deadlock does, within the run)."""
    (text,) = [sql for version, _name, sql in migrations() if version == 18]
    body = text[text.index("CREATE FUNCTION trio_jobs_child_flush") :]
    body = body[: body.index("$$;") + 3]
    body = body.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    if not sorted_:
        old = "FROM unnest(waits, ats) AS t(id, at)"
        assert old in body
        body = body.replace(old, "FROM unnest(waits, ats) WITH ORDINALITY AS t(id, at, n)")
        body = body.replace("ORDER BY t.id", "ORDER BY min(t.n)")
        assert "min(t.n)" in body
    if pause > 0:
        old = "RETURNING * INTO w;"
        assert old in body
        body = body.replace(old, old + f"\n        PERFORM pg_sleep({pause});")
    return body


def _run(cluster: Cluster, tmp: Path, flush: str | None) -> tuple[list[dict[str, int]], int, str]:
    mark = cluster.log_mark()
    with own_database(cluster.dsn()) as dsn:
        trio.run(migrate, dsn)
        if flush is not None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(flush.encode())
        before = deadlocks(dsn)
        did = _stress(dsn, tmp)
        _check_counts(dsn)
        found = deadlocks(dsn) - before
    return did, found, cluster.log_since(mark)


@pytest.mark.parametrize("widened", [False, True], ids=["shipped", "widened"])
def test_no_deadlock_between_two_settlers_of_many_parents(
    pg_cluster: Cluster, tmp_path: Path, widened: bool
) -> None:
    flush = _flush(sorted_=True, pause=0.02) if widened else None
    did, found, log = _run(pg_cluster, tmp_path, flush)
    _check_busy(did)
    assert log.count("ERROR:  deadlock detected") == 0, explain(log)
    assert found == 0, f"pg_stat_database counted {found} deadlocks the log did not show"


def _opposite_settles(dsn: str) -> int:
    """Two statements, each settling one child of wait A and one of wait B, in
    opposite orders (each statement writes its rows in id order: X's child of
    A comes first, Y's child of B), running together: how many deadlocked."""
    ids = sorted(str(uuid.uuid4()) for _ in range(4))
    wait_a, wait_b = str(uuid.uuid4()), str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as conn:
        for wait in (wait_a, wait_b):
            conn.execute(
                "INSERT INTO trio_jobs_child_waits VALUES (%s, gen_random_uuid(), 2, false, 'c', 'q')",
                (wait,),
            )
        for job_id, wait in zip(ids, (wait_a, wait_b, wait_b, wait_a), strict=True):
            conn.execute(
                "INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, idempotency_key, "
                "max_attempts, priority, state, run_at, created_at, updated_at, parent_id, "
                "parent_wait) VALUES (%s, gen_random_uuid(), 'kid', 'q', '{}', %s, 1, 0, "
                "'ready', 0, 0, 0, gen_random_uuid(), %s)",
                (job_id, job_id, wait),
            )
    victims: list[BaseException] = []
    together = threading.Barrier(2)

    def settle(pair: list[str]) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            together.wait(30)
            try:
                conn.execute(
                    "UPDATE trio_jobs_jobs SET state = 'done' WHERE id = ANY(%s::uuid[])", (pair,)
                )
            except psycopg.errors.DeadlockDetected as exc:
                victims.append(exc)

    threads = [threading.Thread(target=settle, args=(pair,)) for pair in (ids[:2], ids[2:])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return len(victims)


@pytest.mark.parametrize("sorted_", [True, False], ids=["by-id", "as-written"])
def test_two_settles_of_two_waits_in_opposite_orders(pg_cluster: Cluster, sorted_: bool) -> None:
    """The stress above did not, on this box, bring two settles of reversed
    waits together (its acks batch few rows); this probe does, on purpose. With
    the waits taken by id (the shipped order, widened by the pause) no
    deadlock; taken as written (the held-back design's order) the server
    finds one and logs it."""
    mark = pg_cluster.log_mark()
    with own_database(pg_cluster.dsn()) as dsn:
        trio.run(migrate, dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_flush(sorted_=sorted_, pause=0.3).encode())
        before = deadlocks(dsn)
        victims = _opposite_settles(dsn)
        found = deadlocks(dsn) - before
        left = sql_rows(dsn, "SELECT count(*) FROM trio_jobs_child_waits")
    logged = pg_cluster.log_since(mark).count("ERROR:  deadlock detected")
    if sorted_:
        assert (victims, found, logged) == (0, 0, 0)
        assert left == [(0,)]  # both waits counted down to zero and gone
    else:
        assert (victims, found, logged) == (1, 1, 1)


def sql_rows(dsn: str, statement: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement.encode()).fetchall()
