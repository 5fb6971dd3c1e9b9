"""The conformance rules of a driver that keeps no done rows (``done_retention=0``).

The ack deletes a job that settles ``done`` with its step records and its
concurrency leases; the counters still count it, its idempotency key enqueues a
new job at once (the key window is the live one, so no enqueue answers
differently). A row something still reads is kept: a child (its parent's
``step.invoke``/``step.gather`` reads its result from the row) and a row of a
``unique_for=`` key (the settled row keeps the key taken). Failed, dead and
cancelled rows are kept as always. Subclass :class:`UnkeptDoneConformance` and
provide ``unkept_target``, a :class:`~trio_jobs.testing.conformance.Target`
over a fresh driver opened with ``done_retention=0``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import attrs
import trio

from ..drivers._protocol import AckOptions, ClaimOptions, NackOptions, StepRecord
from ..errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from .conformance import Target

__all__ = ["UnkeptDoneConformance"]


def _claim(queue: str = "default", n: int = 10) -> ClaimOptions:
    return ClaimOptions(worker_id="w1", queues={queue: n}, visibility_timeout=30.0)


async def _gone(target: Target, job_id: str) -> bool:
    intro = target.driver.introspect
    assert intro is not None
    try:
        await intro.show(job_id)
    except JobsError as exc:
        if exc.code != ErrorCode.X_JOB_NOT_FOUND:
            raise
        return True
    return False


class UnkeptDoneConformance:
    """Every rule of ``done_retention=0``. Subclass it and provide ``unkept_target``."""

    async def test_a_done_job_leaves_no_row_steps_or_leases(self, unkept_target: Target) -> None:
        from .conformance import request

        d = unkept_target.driver
        leases = d.leases
        await d.enqueue_many([request("unkept.job", "k1", concurrency_key="slot")])
        (job,) = (await d.claim(_claim())).jobs
        assert await d.steps.put(job.id, job.fence, StepRecord("s", "completed", 1, 1, 42))
        if leases is not None:
            assert (await leases.acquire("slot", 1, job.id, job.fence, 30.0)).slot == 0
        assert await d.ack(job.id, AckOptions(fence=job.fence, result={"r": 1}, duration=0.25))
        assert await _gone(unkept_target, job.id)
        assert await d.steps.load(job.id) == []
        assert not await d.ack(job.id, AckOptions(fence=job.fence))  # no double settle
        if leases is not None:  # the slot is free: another job takes it at once
            await d.enqueue_many([request("unkept.job", "k2")])
            (other,) = (await d.claim(_claim())).jobs
            assert (await leases.acquire("slot", 1, other.id, other.fence, 30.0)).slot == 0
        intro = d.introspect
        assert intro is not None
        rows = await intro.counters("unkept.job", 0.0)
        assert sum(r.done for r in rows) == 1  # the dashboard still counts it

    async def test_many_acks_at_once_each_delete_their_own_row(self, unkept_target: Target) -> None:
        from .conformance import request

        d = unkept_target.driver
        await d.enqueue_many([request("unkept.many", f"m{i}") for i in range(12)])
        jobs = (await d.claim(_claim(n=12))).jobs
        assert len(jobs) == 12
        landed: list[bool] = []

        async def ack_one(i: int) -> None:
            landed.append(await d.ack(jobs[i].id, AckOptions(fence=jobs[i].fence)))

        async with trio.open_nursery() as nursery:  # the settle combiner batches them
            for i in range(12):
                nursery.start_soon(ack_one, i)
        assert landed == [True] * 12
        for job in jobs:
            assert await _gone(unkept_target, job.id)
        intro = d.introspect
        assert intro is not None
        assert sum(r.done for r in await intro.counters("unkept.many", 0.0)) == 12

    async def test_the_key_of_a_deleted_done_row_enqueues_a_new_job(
        self, unkept_target: Target
    ) -> None:
        from .conformance import request

        d = unkept_target.driver
        (first,) = await d.enqueue_many([request("unkept.key", "same")])
        (job,) = (await d.claim(_claim())).jobs
        assert await d.ack(job.id, AckOptions(fence=job.fence))
        (again,) = await d.enqueue_many([request("unkept.key", "same")])
        assert not again.deduped
        assert again.id != first.id

    async def test_failed_and_dead_rows_are_kept(self, unkept_target: Target) -> None:
        from .conformance import request

        d = unkept_target.driver
        await d.enqueue_many([request("unkept.bad", "a"), request("unkept.bad", "b")])
        a, b = (await d.claim(_claim())).jobs
        dead = NackOptions(fence=a.fence, state="dead", error_code="X_APP", last_error="boom")
        failed = NackOptions(fence=b.fence, state="failed", error_code="X_APP", last_error="boom")
        assert await d.nack(a.id, dead)
        assert await d.nack(b.id, failed)
        intro = d.introspect
        assert intro is not None
        assert {(await intro.show(j.id)).state for j in (a, b)} == {"dead", "failed"}

    async def test_a_child_keeps_its_row_for_its_parent(self, unkept_target: Target) -> None:
        from .conformance import request

        d = unkept_target.driver
        await d.enqueue_many([request("unkept.parent", queue="parents")])
        (parent,) = (await d.claim(_claim("parents", 1))).jobs
        wait = str(uuid.uuid4())
        child_req = attrs.evolve(
            request("unkept.child", f"{parent.run_id}:c", queue="kids"),
            id=wait,
            parent_id=parent.id,
            parent_wait=wait,
        )
        async with d.transaction() as tx:
            (child_id,) = [r.id for r in await tx.enqueue_many([child_req])]
            record = StepRecord("c", "waiting", 0, 1, {"children": [child_id], "wait": wait})
            assert await tx.put_step(parent.id, parent.fence, record)
        (child,) = (await d.claim(_claim("kids", 1))).jobs
        assert await d.ack(child.id, AckOptions(fence=child.fence, result={"v": 7}))
        (state,) = await d.steps.children([child_id])
        assert (state.state, state.result) == ("done", {"v": 7})
        # the parent itself, no child, settles done and goes
        assert await d.ack(parent.id, AckOptions(fence=parent.fence))
        assert await _gone(unkept_target, parent.id)

    async def test_a_unique_for_row_keeps_its_key_taken(self, unkept_target: Target) -> None:
        from .conformance import request

        d = unkept_target.driver
        req = attrs.evolve(request("unkept.unique", "u"), unique_for=60.0)
        (first,) = await d.enqueue_many([req])
        (job,) = (await d.claim(_claim())).jobs
        assert await d.ack(job.id, AckOptions(fence=job.fence))
        (inside,) = await d.enqueue_many([attrs.evolve(req, id=str(uuid.uuid4()))])
        assert inside.deduped
        assert inside.id == first.id
        assert not await _gone(unkept_target, first.id)
