"""The conformance rules of child jobs (``step.invoke`` / ``step.gather``) at
the driver seam: ``EnqueueRequest.parent_id`` / ``.parent_wait``, a
``suspended`` hand-back with ``wait_children``, ``steps.children`` and the
cancel cascade. Part of the suite on every driver that runs child jobs (memory,
PostgreSQL, Redis).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import attrs
import pytest

from ..drivers._protocol import (
    ENQUEUE_CHUNK,
    AckOptions,
    ClaimedJob,
    ClaimOptions,
    NackOptions,
    StepRecord,
)
from ..errors import ErrorCode

if TYPE_CHECKING:
    from .conformance import Target

__all__ = ["ChildrenConformance"]

FAR = 3_600.0


def _claim(queue: str, n: int = 10, worker: str = "w1") -> ClaimOptions:
    return ClaimOptions(worker_id=worker, queues={queue: n}, visibility_timeout=30.0)


async def _parent(target: Target) -> ClaimedJob:
    from .conformance import request

    d = target.driver
    await d.enqueue_many([request("conf.parent", queue="parents")])
    (job,) = (await d.claim(_claim("parents", 1))).jobs
    return job


async def _spawn(target: Target, parent: ClaimedJob, n: int, *, step: str = "all") -> list[str]:
    """The parent's step enqueues ``n`` children and records itself in one
    transaction, as step.gather does; answers the children's ids."""
    from .conformance import request

    wait = str(uuid.uuid4())
    requests = [
        attrs.evolve(
            request("conf.child", f"{parent.run_id}:{step}:{i}", queue="kids", payload={"i": i}),
            id=wait if i == 0 else str(uuid.uuid4()),
            parent_id=parent.id,
            parent_wait=wait,
        )
        for i in range(n)
    ]
    ids: list[str] = []
    async with target.driver.transaction() as tx:
        for start in range(0, n, ENQUEUE_CHUNK):
            got = await tx.enqueue_many(requests[start : start + ENQUEUE_CHUNK])
            ids.extend(r.id for r in got)
        record = StepRecord(step, "waiting", 0, 1, {"children": ids, "wait": wait})
        assert await tx.put_step(parent.id, parent.fence, record)
    return ids


def _suspend(parent: ClaimedJob, ids: list[str]) -> NackOptions:
    return NackOptions(
        parent.fence,
        "suspended",
        counted=False,
        delay=FAR,
        wait_children=True,
        children_wait=ids[0],
    )


async def _settle_all(target: Target, n: int) -> list[str]:
    d = target.driver
    done: list[str] = []
    while len(done) < n:
        got = (await d.claim(_claim("kids", 500))).jobs
        assert got, f"{n - len(done)} children were not claimable"
        for job in got:
            assert await d.ack(job.id, AckOptions(job.fence, result={"sq": job.payload["i"] ** 2}))
            done.append(job.id)
    return done


class ChildrenConformance:
    """Children enqueued with their step record; the parent suspended without a
    slot and made due by its last child's settle; results read in order."""

    async def test_the_last_child_settle_makes_its_parent_due_at_once(self, target: Target) -> None:
        d = target.driver
        parent = await _parent(target)
        ids = await _spawn(target, parent, 3)
        assert await d.nack(parent.id, _suspend(parent, ids))
        kids = (await d.claim(_claim("kids"))).jobs
        assert sorted(k.id for k in kids) == sorted(ids)
        for kid in kids[:-1]:
            assert await d.ack(kid.id, AckOptions(kid.fence, result=kid.payload["i"]))
            assert not (await d.claim(_claim("parents"))).jobs  # one child still live
        last = kids[-1]
        assert await d.nack(last.id, NackOptions(last.fence, "dead", error_code="X_BOOM"))
        (again,) = (await d.claim(_claim("parents"))).jobs  # due now, not in an hour
        assert again.id == parent.id
        states = await d.steps.children(ids)
        assert [c.id for c in states] == ids
        by_id = {k.id: k.payload["i"] for k in kids[:-1]}
        for c in states:
            if c.id == last.id:
                assert (c.state, c.error_code, c.settled) == ("dead", "X_BOOM", True)
            else:
                assert (c.state, c.result, c.settled) == ("done", by_id[c.id], True)

    async def test_children_settled_before_the_hand_back_make_it_due_at_once(
        self, target: Target
    ) -> None:
        d = target.driver
        parent = await _parent(target)
        ids = await _spawn(target, parent, 2)
        await _settle_all(target, 2)  # while the parent still runs
        assert await d.nack(parent.id, _suspend(parent, ids))
        (again,) = (await d.claim(_claim("parents"))).jobs
        assert again.id == parent.id

    async def test_a_live_child_of_an_earlier_step_does_not_hold_up_a_later_one(
        self, target: Target
    ) -> None:
        """A child its step gave up on (X_CHILD_TIMEOUT: it keeps running) is
        counted on its own step's wait, not on the next step's."""
        d = target.driver
        parent = await _parent(target)
        stuck = await _spawn(target, parent, 1, step="slow")
        later = await _spawn(target, parent, 2, step="next")
        assert await d.nack(parent.id, _suspend(parent, later))
        kids = (await d.claim(_claim("kids"))).jobs
        for kid in kids:
            if kid.id in later:
                assert await d.ack(kid.id, AckOptions(kid.fence, result=1))
        assert [j.id for j in (await d.claim(_claim("parents"))).jobs] == [parent.id]
        (slow,) = await d.steps.children(stuck)
        assert not slow.settled

    async def test_a_parent_waiting_on_live_children_is_not_due(self, target: Target) -> None:
        d = target.driver
        parent = await _parent(target)
        ids = await _spawn(target, parent, 2)
        assert await d.nack(parent.id, _suspend(parent, ids))
        await target.advance(60.0)
        assert not (await d.claim(_claim("parents"))).jobs
        await target.advance(FAR)  # the backstop
        assert [j.id for j in (await d.claim(_claim("parents"))).jobs] == [parent.id]

    async def test_children_vanish_with_a_rolled_back_step(self, target: Target) -> None:
        from .conformance import request

        d = target.driver
        parent = await _parent(target)

        class Boom(Exception):
            pass

        child = attrs.evolve(request("conf.child", "x", queue="kids"), parent_id=parent.id)
        child = attrs.evolve(child, parent_wait=child.id)

        async def enqueue_then_fail() -> None:
            async with d.transaction() as tx:
                await tx.enqueue_many([child])
                raise Boom

        with pytest.raises(Boom):
            await enqueue_then_fail()
        assert not (await d.claim(_claim("kids"))).jobs
        assert (await d.steps.children([])) == []

    async def test_an_unknown_child_reads_as_cancelled(self, target: Target) -> None:
        missing = str(uuid.uuid4())
        (state,) = await target.driver.steps.children([missing])
        assert (state.id, state.state, state.error_code) == (
            missing,
            "cancelled",
            ErrorCode.X_ABORTED,
        )

    async def test_a_gather_of_a_thousand_children_in_one_batch(self, target: Target) -> None:
        d = target.driver
        parent = await _parent(target)
        ids = await _spawn(target, parent, 1_000)
        assert len(set(ids)) == 1_000
        assert await d.nack(parent.id, _suspend(parent, ids))
        await _settle_all(target, 1_000)
        assert [j.id for j in (await d.claim(_claim("parents"))).jobs] == [parent.id]
        states = await d.steps.children(ids)
        results: list[Any] = [c.result for c in states]
        payloads = {i: n for n, i in enumerate(ids)}
        assert results == [{"sq": payloads[i] ** 2} for i in ids]

    async def test_cancelling_a_parent_cancels_its_live_children_and_shows_the_tree(
        self, target: Target
    ) -> None:
        d = target.driver
        if d.introspect is None:
            pytest.skip(f"the {d.name} driver declares no introspection")
        parent = await _parent(target)
        ids = await _spawn(target, parent, 3)
        assert await d.nack(parent.id, _suspend(parent, ids))
        first = (await d.claim(_claim("kids", 1))).jobs[0]
        assert await d.ack(first.id, AckOptions(first.fence, result=1))
        view = await d.introspect.show(parent.id)
        assert (view.parent_id, list(view.children)) == (None, ids)
        child = await d.introspect.show(ids[1])
        assert (child.parent_id, list(child.children)) == (parent.id, [])
        await d.introspect.cancel(parent.id)
        states = {c.id: c.state for c in await d.steps.children(ids)}
        assert states == {i: ("done" if i == first.id else "cancelled") for i in ids}
        assert not (await d.claim(_claim("kids"))).jobs
