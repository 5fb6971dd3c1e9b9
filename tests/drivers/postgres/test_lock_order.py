"""One lock order: no statement of the driver can deadlock with another.

Every statement that locks several job rows locks them in id order (see
docs/explanation/design-choices.md, "One lock order"), so two of them may wait
for each other but never in a cycle. Two OS processes (lock_stress.py's ``worker`` mix) run a
busy worker's mix against one schema for a few seconds, with every order
shuffled: heartbeats of every held row, group-committed step records, batched
acks, nacks (retry, backoff, suspend on an event, busy key), concurrency
leases, event publishes and the operator's bulk promote and requeue, over
hundreds of rows. Then the server says how many deadlocks it saw: the
database's ``pg_stat_database.deadlocks`` (a database of the test's own, so no
other work counts), and on a throwaway cluster its log as well.

Deadlocks are counted on the server, not from the processes' errors: a driver
may retry a deadlock victim (SQLSTATE 40P01) as a transient error, and the
stress must still see it. The deadlock timeout is 100 ms here (1 s by
default), so a deadlock is found, and counted, within the run.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio

from trio_jobs.drivers import EnqueueRequest
from trio_jobs.drivers.postgres import migrate, postgres_driver

from . import lock_stress
from .cluster import Cluster
from .lock_stress import deadlock_once, deadlocks, explain, own_database

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.server_side]

#: Rows in the queue, and slots per process: hundreds of rows held at once.
JOBS = 600
SLOTS = 150
SECONDS = 6.0


def _enqueue(dsn: str) -> None:
    async def go() -> None:
        await migrate(dsn)
        d = postgres_driver(dsn, migrate=False)
        await d.open()
        try:
            await d.enqueue_many(
                [
                    EnqueueRequest(
                        id=str(uuid.uuid4()),
                        run_id=str(uuid.uuid4()),
                        name=f"job{i % 4}",  # several names: several counter rows per settle
                        queue="lock",
                        payload={"i": i},
                        idempotency_key=f"k{i}",
                        max_attempts=1_000,
                    )
                    for i in range(JOBS)
                ]
            )
        finally:
            await d.close()

    trio.run(go)


def stress(dsn: str, tmp: Path) -> list[dict[str, int]]:
    """Two ``worker`` load processes against ``dsn`` for SECONDS; what each did."""
    _enqueue(dsn)
    return lock_stress.stress("worker", dsn, tmp, SECONDS, SLOTS, FLOORS)


#: What each load process must have done for the stress to prove anything.
FLOORS = {
    "heartbeat": 20,
    "step": 300,
    "ack": 100,
    "nack": 100,
    "claim": 20,
    "publish": 20,
    "promote_many": 10,
    "requeue_many": 10,
    "lease": 20,
}


def check_busy(did: list[dict[str, int]]) -> None:
    """The stress did contend: each process made every kind of call, many times."""
    print(did)
    for counts in did:
        for what, least in FLOORS.items():
            assert counts.get(what, 0) >= least, (what, counts)


def test_the_counts_see_a_deadlock(pg_dsn: str, pg_cluster: Cluster) -> None:
    """The two witnesses below work: a deadlock made on purpose is counted, and logged."""
    with own_database(pg_dsn) as dsn:
        before = deadlocks(dsn)
        deadlock_once(dsn)
        assert deadlocks(dsn) - before == 1
    mark = pg_cluster.log_mark()
    with own_database(pg_cluster.dsn()) as dsn:
        before = deadlocks(dsn)
        deadlock_once(dsn)
        assert deadlocks(dsn) - before == 1
    assert pg_cluster.log_since(mark).count("ERROR:  deadlock detected") == 1


def test_no_deadlock_between_two_busy_workers(pg_dsn: str, tmp_path: Path) -> None:
    """On the test server, in a database of the test's own."""
    with own_database(pg_dsn) as dsn:
        before = deadlocks(dsn)
        did = stress(dsn, tmp_path)
        found = deadlocks(dsn) - before
    check_busy(did)
    assert found == 0, f"the server saw {found} deadlocks; the processes saw: {did}"


def test_no_deadlock_in_the_server_log(pg_cluster: Cluster, tmp_path: Path) -> None:
    """On a throwaway cluster, whose log the test reads too."""
    mark = pg_cluster.log_mark()
    with own_database(pg_cluster.dsn()) as dsn:
        before = deadlocks(dsn)
        did = stress(dsn, tmp_path)
        found = deadlocks(dsn) - before
    log = pg_cluster.log_since(mark)
    check_busy(did)
    logged = log.count("ERROR:  deadlock detected")
    assert logged == 0, explain(log)
    assert found == 0, f"pg_stat_database counted {found} deadlocks the log did not show"
