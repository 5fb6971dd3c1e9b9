"""One lock order: no statement of the driver can deadlock with another.

Every statement that locks several job rows locks them in id order (see
docs/explanation/design-choices.md, "One lock order"), so two of them may wait
for each other but never in a cycle. Two OS processes (lock_order_load.py) run a
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

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs.drivers import EnqueueRequest
from trio_jobs.drivers.postgres import migrate, postgres_driver
from trio_jobs.drivers.postgres._sql import load_queries

from .cluster import Cluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LOAD = Path(__file__).with_name("lock_order_load.py")
#: Rows in the queue, and slots per process: hundreds of rows held at once.
JOBS = 600
SLOTS = 150
SECONDS = 6.0


def _with_db(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@contextmanager
def own_database(admin_dsn: str) -> Iterator[str]:
    """A fresh database (its own deadlock counter), dropped afterwards."""
    name = f"tj_lock_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        try:  # find a deadlock within the run (superuser only; else the 1 s default)
            conn.execute(f"ALTER DATABASE \"{name}\" SET deadlock_timeout = '100ms'")
        except psycopg.errors.InsufficientPrivilege:
            pass
    try:
        yield _with_db(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def deadlocks(dsn: str, timeout: float = 30) -> int:
    """The database's deadlock count, once every other session on it has ended.

    A backend counts a deadlock in its own pending statistics and flushes them
    at most once a second, and always as it exits, before it leaves
    ``pg_stat_activity``: so once no other backend is connected, the count is
    complete. ``pg_stat_force_next_flush`` flushes this session's own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND pid <> pg_backend_pid()"
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "sessions on the test database did not end"
            time.sleep(0.05)
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT coalesce(deadlocks, 0) FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


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
    """Two load processes against ``dsn`` for SECONDS; what each did."""
    _enqueue(dsn)
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as files:
        try:
            for seed in (1, 2):
                err = files.enter_context((tmp / f"load{seed}.err").open("wb"))
                argv = [sys.executable, str(LOAD), dsn, str(SECONDS), str(seed), str(SLOTS)]
                procs.append(
                    subprocess.Popen(
                        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
                    )
                )
            for proc in procs:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == b"ready", (tmp / "load1.err").read_text()
            for proc in procs:  # both are connected: they start together
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                proc.stdin.flush()
            did = []
            for seed, proc in enumerate(procs, start=1):
                out, _ = proc.communicate(timeout=SECONDS + 30)
                log = (tmp / f"load{seed}.err").read_text("utf-8", "replace")
                assert proc.returncode == 0, log
                did.append(orjson.loads(out.splitlines()[-1]))
            return did
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)


def deadlock_once(dsn: str) -> None:
    """Two sessions that lock two rows in opposite orders: one deadlock, on purpose."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE lock_probe (id int PRIMARY KEY)")
        setup.execute("INSERT INTO lock_probe VALUES (1), (2)")
    a, b = psycopg.connect(dsn), psycopg.connect(dsn)
    victims: list[BaseException] = []

    def second(conn: psycopg.Connection[object], row: int) -> None:
        try:
            conn.execute("SELECT 1 FROM lock_probe WHERE id = %s FOR UPDATE", (row,))
        except psycopg.errors.DeadlockDetected as exc:
            victims.append(exc)
        conn.rollback()

    with a, b:
        a.execute("SELECT 1 FROM lock_probe WHERE id = 1 FOR UPDATE")
        b.execute("SELECT 1 FROM lock_probe WHERE id = 2 FOR UPDATE")
        waiter = threading.Thread(target=second, args=(a, 2))
        waiter.start()
        time.sleep(0.05)  # a waits for b; now b waits for a
        second(b, 1)
        waiter.join(30)
    assert len(victims) == 1, victims


def check_busy(did: list[dict[str, int]]) -> None:
    """The stress did contend: each process made every kind of call, many times."""
    print(did)
    for counts in did:
        for what, least in (
            ("heartbeat", 20),
            ("step", 300),
            ("ack", 100),
            ("nack", 100),
            ("claim", 20),
            ("publish", 20),
            ("promote_many", 10),
            ("requeue_many", 10),
            ("lease", 20),
        ):
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


def explain(log: str) -> str:
    """The server's account of the deadlocks: how many, between which named queries."""
    pairs: Counter[str] = Counter()
    for block in log.split("ERROR:  deadlock detected")[1:]:
        detail = block.split("STATEMENT:")[0]
        names = sorted(_query_name(text) for text in re.split(r"\n\s*Process \d+: ", detail)[1:])
        pairs[" x ".join(names)] += 1
    shown = "\n".join(f"  {n:4d}  {pair}" for pair, n in pairs.most_common())
    return f"the server logged {sum(pairs.values())} deadlocks, between:\n{shown}"


def _normal(text: str) -> str:
    text = re.sub(r"%\(\w+\)s|\$\d+", "?", text)
    return re.sub(r"\s+", " ", text).strip()


def _query_name(logged: str) -> str:
    """Which named query a logged statement is (the log may cut it short)."""
    head = _normal(logged)[:300]
    for name, body in load_queries().items():
        if _normal(body).startswith(head):
            return name
    return head[:60] + "..."
