"""The conformance rules of ``job(debounce=)`` and ``job(unique_for=)`` at the
driver seam (``EnqueueRequest.debounce`` / ``.unique_for``): part of
:class:`~trio_jobs.testing.conformance.DriverConformance`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ..drivers._protocol import AckOptions, ClaimOptions, EnqueueRequest, NackOptions

if TYPE_CHECKING:
    from .conformance import Target

__all__ = ["DebounceConformance"]


def _req(key: str, payload: Any, **kw: Any) -> EnqueueRequest:
    from .conformance import request

    return attrs.evolve(request("conf.debounce", key, payload=payload), **kw)


def _claim() -> ClaimOptions:
    return ClaimOptions(worker_id="w1", queues={"default": 10}, visibility_timeout=30.0)


class DebounceConformance:
    """Debounced enqueues collapse into one run due ``debounce`` after the last,
    with the last input; a key declared ``unique_for`` stays taken that long
    after its run settled."""

    async def test_debounced_enqueues_collapse_into_one_run_with_the_last_input(
        self, target: Target
    ) -> None:
        d = target.driver
        first = (await d.enqueue_many([_req("k", {"v": 1}, debounce=5.0)]))[0]
        assert not first.deduped
        assert not (await d.claim(_claim())).jobs  # due 5 s after the enqueue
        await target.advance(3.0)
        second = (await d.enqueue_many([_req("k", {"v": 2}, debounce=5.0)]))[0]
        assert second.deduped
        assert (second.id, second.run_id) == (first.id, first.run_id)
        await target.advance(3.0)  # 6 s after the first, 3 s after the last
        assert not (await d.claim(_claim())).jobs
        await target.advance(2.5)
        got = (await d.claim(_claim())).jobs
        assert [j.id for j in got] == [first.id]
        assert got[0].payload == {"v": 2}

    async def test_debounced_inputs_in_one_batch_are_one_run_with_the_last(
        self, target: Target
    ) -> None:
        d = target.driver
        out = await d.enqueue_many(
            [_req("b", {"v": 1}, debounce=5.0), _req("b", {"v": 2}, debounce=5.0)]
        )
        assert [r.deduped for r in out] == [False, True]
        assert out[0].id == out[1].id
        await target.advance(5.5)
        got = (await d.claim(_claim())).jobs
        assert [(j.id, j.payload) for j in got] == [(out[0].id, {"v": 2})]

    async def test_a_running_debounced_run_dedupes_like_any_live_key(self, target: Target) -> None:
        d = target.driver
        first = (await d.enqueue_many([_req("r", {"v": 1}, debounce=5.0)]))[0]
        await target.advance(5.5)
        job = (await d.claim(_claim())).jobs[0]
        again = (await d.enqueue_many([_req("r", {"v": 2}, debounce=5.0)]))[0]
        assert again.deduped
        assert again.id == first.id
        assert await d.ack(job.id, AckOptions(fence=job.fence))
        await target.advance(60.0)
        assert not (await d.claim(_claim())).jobs  # the live dedupe made no second run
        later = (await d.enqueue_many([_req("r", {"v": 3}, debounce=5.0)]))[0]
        assert not later.deduped  # settled: the key is free again

    async def test_a_sleeping_debounced_run_is_not_moved(self, target: Target) -> None:
        d = target.driver
        first = (await d.enqueue_many([_req("s", {"v": 1}, debounce=5.0)]))[0]
        await target.advance(5.5)
        job = (await d.claim(_claim())).jobs[0]
        # A step.sleep hands the run back uncounted: it has started all the same.
        assert await d.nack(
            job.id, NackOptions(fence=job.fence, state="delayed", counted=False, delay=10.0)
        )
        again = (await d.enqueue_many([_req("s", {"v": 2}, debounce=5.0)]))[0]
        assert again.deduped
        assert again.id == first.id
        await target.advance(10.5)
        got = (await d.claim(_claim())).jobs
        assert [(j.id, j.payload) for j in got] == [(first.id, {"v": 1})]

    async def test_a_unique_key_stays_taken_after_its_run_settled(self, target: Target) -> None:
        d = target.driver
        first = (await d.enqueue_many([_req("u", {"v": 1}, unique_for=60.0)]))[0]
        job = (await d.claim(_claim())).jobs[0]
        assert await d.ack(job.id, AckOptions(fence=job.fence, result=1))
        await target.advance(30.0)
        inside = (await d.enqueue_many([_req("u", {"v": 2}, unique_for=60.0)]))[0]
        assert inside.deduped
        assert (inside.id, inside.run_id) == (first.id, first.run_id)
        assert not (await d.claim(_claim())).jobs
        await target.advance(31.0)
        after = (await d.enqueue_many([_req("u", {"v": 3}, unique_for=60.0)]))[0]
        assert not after.deduped
        assert after.id != first.id

    async def test_a_dead_run_holds_its_unique_key_too(self, target: Target) -> None:
        d = target.driver
        first = (await d.enqueue_many([_req("x", {"v": 1}, unique_for=60.0)]))[0]
        job = (await d.claim(_claim())).jobs[0]
        assert await d.nack(job.id, NackOptions(fence=job.fence, state="dead", error_code="X"))
        again = (await d.enqueue_many([_req("x", {"v": 2}, unique_for=60.0)]))[0]
        assert again.deduped
        assert again.id == first.id

    async def test_without_unique_for_a_settled_key_is_free(self, target: Target) -> None:
        d = target.driver
        first = (await d.enqueue_many([_req("f", {"v": 1})]))[0]
        job = (await d.claim(_claim())).jobs[0]
        assert await d.ack(job.id, AckOptions(fence=job.fence))
        again = (await d.enqueue_many([_req("f", {"v": 2}, unique_for=60.0)]))[0]
        # The settled run was not enqueued with unique_for: it holds nothing.
        assert not again.deduped
        assert again.id != first.id
