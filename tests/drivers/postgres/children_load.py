"""One process of the child-jobs lock-order stress (test_children_lock_order.py;
not collected).

    python children_load.py DSN SECONDS SEED SLOTS

Drives one PostgresDriver the way a busy worker runs many parents' children,
through the driver's own methods: a claimer keeps SLOTS slots full of children
(of many parents at once); each slot acks its child (the settle combiner
batches children of many waits into one ``ack_many``, in shuffled order), or
buries it (a final nack), or hands it back for a retry; one task heartbeats
every held row in shuffled order; an operator cancels a parent now and then
(its live children with it) and removes a child that waits. Nothing lines the
rows up but the SQL. Prints ``ready`` once connected, waits for a line on
stdin, runs SECONDS, prints what it did as one JSON line; a failed call is
counted, never fatal (the test counts deadlocks on the server).
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
    ClaimedJob,
    ClaimOptions,
    Fence,
    HeartbeatRequest,
    NackOptions,
)
from trio_jobs.drivers.postgres import PostgresDriver, postgres_driver

KIDS = "kids"
VISIBILITY = 60.0


class Load:
    def __init__(self, d: PostgresDriver, seed: int, slots: int, parents: list[str]) -> None:
        self.d = d
        self.rng = random.Random(seed)
        self.slots = slots
        self.parents = parents
        self.worker_id = f"kids-{seed}"
        self.held: dict[str, Fence] = {}
        self.queued = 0
        self.did: Counter[str] = Counter()
        self.send, self.recv = trio.open_memory_channel[ClaimedJob](math.inf)

    async def call(self, what: str, fn: object, *args: object) -> object:
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
                options = ClaimOptions(self.worker_id, {KIDS: room}, VISIBILITY)
                result = await self.call("claim", self.d.claim, options)
                jobs = list(getattr(result, "jobs", []))
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
                await trio.sleep(self.rng.random() * 0.01)
                await self.run(job)
            finally:
                self.held.pop(job.id, None)

    async def run(self, job: ClaimedJob) -> None:
        d, fence, roll = self.d, job.fence, self.rng.random()
        if roll < 0.8:
            await self.call("ack", d.ack, job.id, AckOptions(fence, result={"ok": job.id}))
        elif roll < 0.9:
            dead = NackOptions(fence, "dead", error_code="X_BOOM", last_error="X_BOOM: no")
            await self.call("bury", d.nack, job.id, dead)
        else:
            await self.call("retry", d.nack, job.id, NackOptions(fence, "ready", counted=False))

    async def heartbeater(self) -> None:
        while True:
            held = list(self.held.items())
            self.rng.shuffle(held)
            requests = [HeartbeatRequest(job_id, fence) for job_id, fence in held]
            await self.call("heartbeat", self.d.heartbeat, requests, VISIBILITY)
            await trio.sleep(0.01)

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


async def main(dsn: str, seconds: float, seed: int, slots: int) -> None:
    d = postgres_driver(dsn, migrate=False, pool_size=16)
    await d.open()
    try:
        parents = orjson.loads(sys.stdin.readline())
        load = Load(d, seed, slots, parents)
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # the go: both start together
        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                for task in (load.claimer, load.heartbeater, load.operator):
                    nursery.start_soon(task)
                for _ in range(slots):
                    nursery.start_soon(load.slot)
    finally:
        await d.close()
    print(orjson.dumps(dict(load.did)).decode(), flush=True)


if __name__ == "__main__":
    dsn, seconds, seed, slots = sys.argv[1:5]
    trio.run(main, dsn, float(seconds), int(seed), int(slots))
