"""The lock-order stress tests' one helper module (test_lock_order.py and
test_children_lock_order.py; not collected).

The test side: a database of the test's own (``own_database``, so its
``pg_stat_database.deadlocks`` counts nothing else), the server's deadlock
count (``deadlocks``), a deadlock made on purpose (``deadlock_once``), the
server log's account of deadlocks (``explain``) and ``stress``, which runs
two load processes of one mix against a database together.

The process side, run as a script by ``stress``:

    python lock_stress.py MIX DSN SECONDS SEED SLOTS FLOORS

drives one PostgresDriver the way a busy worker does, through the driver's
own methods, with every order shuffled so nothing lines the rows up but the
SQL. A claimer keeps SLOTS slots full; one task heartbeats every held row in
one statement, in an order unrelated to the others'. The mixes:

``worker`` (test_lock_order.py): each slot writes a few step records (the
group commit batches the slots' records into one ``steps_put_many``),
sometimes takes a concurrency lease, then acks (the settle combiner batches
them into ``ack_many``) or nacks (ready now, ready backing off, suspended on
an event, or waiting on a busy key); one task publishes the events the
suspended rows wait on; one runs the operator's bulk ``promote_many`` and
``requeue_many``.

``children`` (test_children_lock_order.py; its first stdin line is the JSON
list of parent ids): the claims mix many parents' children; each slot acks
its child (the settle combiner batches children of many waits into one
``ack_many``, in shuffled order), or buries it (a final nack), or hands it
back for a retry; an operator cancels a parent now and then (its live
children with it) and removes a child that waits.

A process prints ``ready`` once connected, waits for a line on stdin (the go:
both start together), runs SECONDS (and on, until it made each kind of call
FLOORS, a JSON object, asks for) and prints what it did as one JSON line. A
failed call is counted, never fatal: the tests count deadlocks on the server,
not here (a driver may retry a deadlock victim as a transient error).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs.drivers import (
    AckOptions,
    BulkFilter,
    ClaimedJob,
    ClaimOptions,
    Fence,
    HeartbeatRequest,
    NackOptions,
    StepRecord,
)
from trio_jobs.drivers.postgres import PostgresDriver, postgres_driver
from trio_jobs.drivers.postgres._sql import load_queries

SCRIPT = Path(__file__)
VISIBILITY = 60.0
#: How much longer than SECONDS a load process may run to reach its floors.
OVERTIME = 4

# --------------------------------------------------------------------------- the test side


def _with_db(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@contextlib.contextmanager
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


def stress(
    mix: str,
    dsn: str,
    tmp: Path,
    seconds: float,
    slots: int,
    floors: dict[str, int],
    first_line: bytes | None = None,
) -> list[dict[str, int]]:
    """Two load processes of ``mix`` against ``dsn`` for ``seconds``, started
    together (``first_line``, when given, is each one's first stdin line), each
    going on past ``seconds`` (up to OVERTIME times as long) until it made every
    kind of call in ``floors`` that many times; what each did."""
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    procs: list[subprocess.Popen[bytes]] = []
    errs = [tmp / f"{mix}{seed}.err" for seed in (1, 2)]
    with contextlib.ExitStack() as files:
        try:
            for seed, err_path in enumerate(errs, start=1):
                err = files.enter_context(err_path.open("wb"))
                argv = [
                    sys.executable,
                    str(SCRIPT),
                    mix,
                    dsn,
                    str(seconds),
                    str(seed),
                    str(slots),
                    orjson.dumps(floors).decode(),
                ]
                procs.append(
                    subprocess.Popen(
                        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
                    )
                )
            for proc in procs:
                assert proc.stdin is not None
                assert proc.stdout is not None
                if first_line is not None:
                    proc.stdin.write(first_line.rstrip(b"\n") + b"\n")
                    proc.stdin.flush()
                assert proc.stdout.readline().strip() == b"ready", errs[0].read_text()
            for proc in procs:  # both are connected: they start together
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                proc.stdin.flush()
            did = []
            for err_path, proc in zip(errs, procs, strict=True):
                out, _ = proc.communicate(timeout=seconds * (1 + OVERTIME) + 60)
                log = err_path.read_text("utf-8", "replace")
                assert proc.returncode == 0, log
                did.append(orjson.loads(out.splitlines()[-1]))
            return did
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)


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


# --------------------------------------------------------------------------- the process side


class Load:
    """What both mixes share: the claimer, the slots, the heartbeater."""

    queue = ""
    #: Whether the claimer hands its claimed jobs to the slots in shuffled order.
    shuffle_claims = False

    def __init__(self, d: PostgresDriver, seed: int, slots: int) -> None:
        self.d = d
        self.rng = random.Random(seed)
        self.slots = slots
        self.worker_id = f"{self.queue}-{seed}"
        self.held: dict[str, Fence] = {}
        self.queued = 0
        self.did: Counter[str] = Counter()
        self.send, self.recv = trio.open_memory_channel[ClaimedJob](math.inf)

    async def call(self, what: str, fn: object, *args: object) -> object:
        """Run one driver call; count it, or count its failure and answer None."""
        try:
            out = await fn(*args)  # type: ignore[operator]
        except Exception as exc:
            self.did[f"error:{what}:{getattr(exc, 'code', type(exc).__name__)}"] += 1
            return None
        self.did[what] += 1
        return out

    async def claimer(self) -> None:
        while True:
            room = self.slots - len(self.held) - self.queued
            if room > 0:
                options = ClaimOptions(self.worker_id, {self.queue: room}, VISIBILITY)
                result = await self.call("claim", self.d.claim, options)
                jobs = list(getattr(result, "jobs", []))
                if self.shuffle_claims:
                    self.rng.shuffle(jobs)
                for job in jobs:
                    self.held[job.id] = job.fence
                    self.queued += 1
                    self.send.send_nowait(job)
            await trio.sleep(0.005)

    async def slot(self) -> None:
        async for job in self.recv:
            self.queued -= 1
            try:
                await self.run(job)
            finally:
                self.held.pop(job.id, None)

    async def run(self, job: ClaimedJob) -> None:
        raise NotImplementedError

    async def heartbeater(self) -> None:
        while True:
            held = list(self.held.items())
            self.rng.shuffle(held)
            requests = [HeartbeatRequest(job_id, fence) for job_id, fence in held]
            await self.call("heartbeat", self.d.heartbeat, requests, VISIBILITY)
            await trio.sleep(0.01)

    def tasks(self) -> list[object]:
        """The tasks besides the slots."""
        return [self.claimer, self.heartbeater]


class WorkerLoad(Load):
    """The ``worker`` mix: a busy worker's whole mix of calls."""

    queue = "lock"
    events = ("paid", "shipped")
    lease_keys = ("k0", "k1", "k2")

    async def run(self, job: ClaimedJob) -> None:
        rng, d, fence = self.rng, self.d, job.fence
        key = rng.choice(self.lease_keys) if rng.random() < 0.25 else None
        if key is not None:
            grant = await self.call("lease", d.leases.acquire, key, 2, job.id, fence, VISIBILITY)  # type: ignore[union-attr]
            if grant is not None and grant.slot is None:  # type: ignore[attr-defined]
                busy = NackOptions(fence, "ready", counted=False, delay=2.0, busy_key=key)
                await self.call("nack", d.nack, job.id, busy)
                return
        for seq in range(rng.randint(1, 3)):
            await trio.sleep(rng.random() * 0.004)
            record = StepRecord(f"s{seq}", "completed", seq, executions=1, output={"n": seq})
            if not await self.call("step", d.steps.put, job.id, fence, record):
                return
        roll = rng.random()
        if roll < 0.45:
            await self.call("ack", d.ack, job.id, AckOptions(fence, result={"ok": True}))
            return
        if roll < 0.6:
            options = NackOptions(fence, "ready", counted=False)
        elif roll < 0.75:
            options = NackOptions(fence, "ready", counted=False, delay=3600.0)  # promote_many's
        else:
            event = rng.choice(self.events)
            options = NackOptions(
                fence, "suspended", counted=False, delay=3600.0, waiting_event=event
            )
        await self.call("nack", d.nack, job.id, options)

    async def publisher(self) -> None:
        while True:
            await self.call("publish", self.d.events.publish, self.rng.choice(self.events), {})
            await trio.sleep(0.02)

    async def operator(self) -> None:
        ops = self.d.introspect
        assert ops is not None
        while True:
            await self.call("promote_many", ops.promote_many, BulkFilter("ready", self.queue))
            await trio.sleep(0.02)
            await self.call("requeue_many", ops.requeue_many, BulkFilter("done", self.queue))
            await trio.sleep(0.02)

    def tasks(self) -> list[object]:
        return [*super().tasks(), self.publisher, self.operator]


class ChildrenLoad(Load):
    """The ``children`` mix: children of many parents settled at once."""

    queue = "kids"
    shuffle_claims = True

    def __init__(self, d: PostgresDriver, seed: int, slots: int, parents: list[str]) -> None:
        super().__init__(d, seed, slots)
        self.parents = parents

    async def run(self, job: ClaimedJob) -> None:
        await trio.sleep(self.rng.random() * 0.01)
        d, fence, roll = self.d, job.fence, self.rng.random()
        if roll < 0.8:
            await self.call("ack", d.ack, job.id, AckOptions(fence, result={"ok": job.id}))
        elif roll < 0.9:
            dead = NackOptions(fence, "dead", error_code="X_BOOM", last_error="X_BOOM: no")
            await self.call("bury", d.nack, job.id, dead)
        else:
            await self.call("retry", d.nack, job.id, NackOptions(fence, "ready", counted=False))

    async def operator(self) -> None:
        ops = self.d.introspect
        assert ops is not None
        while True:
            await trio.sleep(0.05)
            parent = self.rng.choice(self.parents)
            view = await self.call("show", ops.show, parent)
            if self.rng.random() < 0.3 and getattr(view, "state", None) == "suspended":
                await self.call("cancel", ops.cancel, parent)
            children = list(getattr(view, "children", ()))
            if children:
                child = await self.call("show", ops.show, self.rng.choice(children))
                if getattr(child, "state", None) == "ready":
                    await self.call("remove", ops.remove, child.id)  # type: ignore[attr-defined]

    def tasks(self) -> list[object]:
        return [*super().tasks(), self.operator]


async def main(
    mix: str, dsn: str, seconds: float, seed: int, slots: int, floors: dict[str, int]
) -> None:
    d = postgres_driver(dsn, migrate=False, pool_size=16)
    await d.open()
    try:
        if mix == "children":
            parents = orjson.loads(await trio.to_thread.run_sync(sys.stdin.readline))
            load: Load = ChildrenLoad(d, seed, slots, parents)
        else:
            assert mix == "worker", mix
            load = WorkerLoad(d, seed, slots)
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # the go: both start together
        async with trio.open_nursery() as nursery:
            for task in load.tasks():
                nursery.start_soon(task)  # type: ignore[arg-type]
            for _ in range(slots):
                nursery.start_soon(load.slot)
            await trio.sleep(seconds)
            # On a loaded box SECONDS may not be enough work to prove anything:
            # go on until this process made every kind of call its floor asks
            # for (the test asserts the same floors), up to OVERTIME times more.
            with trio.move_on_after(seconds * OVERTIME):
                while True:
                    if all(load.did[what] >= least for what, least in floors.items()):
                        break
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        await d.close()
    print(orjson.dumps(dict(load.did)).decode(), flush=True)


if __name__ == "__main__":
    mix, dsn, seconds, seed, slots, floors = sys.argv[1:7]
    trio.run(main, mix, dsn, float(seconds), int(seed), int(slots), orjson.loads(floors))
