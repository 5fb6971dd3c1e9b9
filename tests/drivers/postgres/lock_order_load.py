"""One process of the lock-order stress test (test_lock_order.py; not collected).

    python lock_order_load.py DSN SECONDS SEED SLOTS

Drives one PostgresDriver the way a busy worker does, through the driver's own
methods: a claimer keeps SLOTS slots full; each slot writes a few step records
(the group commit batches the slots' records into one ``steps_put_many``),
sometimes takes a concurrency lease, then acks (the settle combiner batches
them into ``ack_many``) or nacks (ready now, ready backing off, suspended on an
event, or waiting on a busy key); one task heartbeats every held row in one
statement, in an order unrelated to the others'; one publishes the events the
suspended rows wait on; one runs the operator's bulk ``promote_many`` and
``requeue_many``. Every order is shuffled: nothing lines the rows up but the
SQL. It prints ``ready`` once connected, waits for a line on stdin, runs
SECONDS, and prints what it did as one JSON line. A failed call is counted, never fatal:
the test counts deadlocks on the server, not here.
"""

from __future__ import annotations

import math
import random
import sys
from collections import Counter

import orjson
import trio

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

QUEUE = "lock"
EVENTS = ("paid", "shipped")
LEASE_KEYS = ("k0", "k1", "k2")
VISIBILITY = 60.0


class Load:
    def __init__(self, d: PostgresDriver, seed: int, slots: int) -> None:
        self.d = d
        self.rng = random.Random(seed)
        self.slots = slots
        self.worker_id = f"lock-{seed}"
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
                options = ClaimOptions(self.worker_id, {QUEUE: room}, VISIBILITY)
                result = await self.call("claim", self.d.claim, options)
                for job in getattr(result, "jobs", []):
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
        rng, d, fence = self.rng, self.d, job.fence
        key = rng.choice(LEASE_KEYS) if rng.random() < 0.25 else None
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
            event = rng.choice(EVENTS)
            options = NackOptions(
                fence, "suspended", counted=False, delay=3600.0, waiting_event=event
            )
        await self.call("nack", d.nack, job.id, options)

    async def heartbeater(self) -> None:
        while True:
            held = list(self.held.items())
            self.rng.shuffle(held)
            requests = [HeartbeatRequest(job_id, fence) for job_id, fence in held]
            await self.call("heartbeat", self.d.heartbeat, requests, VISIBILITY)
            await trio.sleep(0.01)

    async def publisher(self) -> None:
        while True:
            await self.call("publish", self.d.events.publish, self.rng.choice(EVENTS), {})
            await trio.sleep(0.02)

    async def operator(self) -> None:
        ops = self.d.introspect
        assert ops is not None
        while True:
            await self.call("promote_many", ops.promote_many, BulkFilter("ready", QUEUE))
            await trio.sleep(0.02)
            await self.call("requeue_many", ops.requeue_many, BulkFilter("done", QUEUE))
            await trio.sleep(0.02)


async def main(dsn: str, seconds: float, seed: int, slots: int) -> None:
    d = postgres_driver(dsn, migrate=False, pool_size=16)
    await d.open()
    try:
        load = Load(d, seed, slots)
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # the go: both start together
        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                for task in (load.claimer, load.heartbeater, load.publisher, load.operator):
                    nursery.start_soon(task)
                for _ in range(slots):
                    nursery.start_soon(load.slot)
    finally:
        await d.close()
    print(orjson.dumps(dict(load.did)).decode(), flush=True)


if __name__ == "__main__":
    dsn, seconds, seed, slots = sys.argv[1:5]
    trio.run(main, dsn, float(seconds), int(seed), int(slots))
