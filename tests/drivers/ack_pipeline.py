"""The worker's ack pipeline (``driver.acks``), one suite for every driver that
offers it: a slot hands its ack off and goes on; the pipeline sends the batch,
settles each attempt by its answer, and holds the attempt's room until the
answer came (docs/explanation/design-choices.md, "Acks leave the slot").

Mixed into a test class per driver, which provides ``fresh``: a driver not yet
opened, on its real clock (``open_jobs`` opens it). Everything is read back
through the driver's public surface (``introspect``), never a backdoor, so one
text holds the memory, PostgreSQL and Redis drivers to the same answers; what
only one driver has stays in that driver's own tests: above all a batch whose
answer was lost, which only the driver can lose and recognise (PostgreSQL
retries the batch, Redis each ack alone; a loss raised above the driver, after
it answered, is one no driver could see)."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from trio_jobs import JobContext, Worker, job, open_jobs
from trio_jobs._worker import PREFETCH_MAX
from trio_jobs.drivers import JobDriver, ListFilter
from trio_jobs.drivers._protocol import Fence, JobView

NAME = "pipe.noop"


@job(name=NAME, input=int, idempotency_key=lambda i: f"pipe:{i}")
async def noop(ctx: JobContext[int]) -> int:
    return ctx.input * 2


async def _until(check: Any, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while not await check():  # noqa: ASYNC110 — bounded wait on the driver
            await trio.sleep(0.02)


async def _views(driver: JobDriver) -> list[JobView]:
    """Every job's view, page after page."""
    intro = driver.introspect
    assert intro is not None
    out: list[JobView] = []
    after: str | None = None
    while True:
        page = await intro.list(ListFilter(name=NAME, limit=200, after=after))
        out.extend(page.rows)
        if page.after is None or not page.rows:
            return out
        after = page.after


async def _done_counted(driver: JobDriver) -> int:
    assert driver.introspect is not None
    return sum(r.done for r in await driver.introspect.counters(NAME, 0.0))


class AckPipelineConformance:
    async def test_acks_go_through_the_pipeline_and_each_job_is_done_once(
        self, fresh: JobDriver
    ) -> None:
        driver = fresh
        assert driver.acks is not None
        batches: list[int] = []
        async with open_jobs(driver, jobs=[noop]) as jobs:
            await noop.enqueue_many(range(200))
            inner = driver.acks.ack_many

            async def counting(acks: Any) -> list[bool]:
                batches.append(len(acks))
                return await inner(acks)

            driver.acks.ack_many = counting  # type: ignore[method-assign]
            worker = Worker(jobs, concurrency=32)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)

                async def all_done() -> bool:
                    return worker.stats().done == 200

                await _until(all_done)
                await worker.drain()
            views = await _views(driver)
            counted = await _done_counted(driver)
        assert sum(batches) == 200  # every ack through ack_many, none through ack()
        # Never more acks in flight than rows held: a queue holds at most twice its
        # slots and its prefetch while acks are in flight.
        assert max(batches) <= 2 * (32 + PREFETCH_MAX)
        assert len(views) == 200
        assert {(v.state, v.attempts) for v in views} == {("done", 1)}
        assert sorted(v.result for v in views) == [2 * i for i in range(200)]
        assert counted == 200
        assert worker.stats().in_flight == 0

    async def test_a_refused_ack_is_unowned_and_frees_its_room(self, fresh: JobDriver) -> None:
        driver = fresh
        assert driver.acks is not None
        async with open_jobs(driver, jobs=[noop]) as jobs:
            await noop.enqueue(1)
            inner = driver.acks.ack_many
            refused: list[bool] = []

            async def fenced_out(acks: Any) -> list[bool]:
                # Not this row's claim any more (another worker took it over, as
                # far as the driver can tell): the driver must refuse the settle.
                stale = [
                    (job_id, attrs.evolve(o, fence=Fence(o.fence.worker_id, o.fence.claim + 1000)))
                    for job_id, o in acks
                ]
                answers = await inner(stale)
                refused.extend(answers)
                return answers

            driver.acks.ack_many = fenced_out  # type: ignore[method-assign]
            worker = Worker(jobs, concurrency=2)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)

                async def answered() -> bool:
                    return worker.stats().in_flight == 0 and bool(refused)

                await _until(answered)
                await worker.drain()
            views = await _views(driver)
            counted = await _done_counted(driver)
        assert refused == [False]
        assert worker.stats().done == 0
        assert [v.state for v in views] == ["running"]  # still the first claim's, until it lapses
        assert counted == 0

    async def test_an_ack_in_flight_leaves_its_room_to_the_next_claim_and_the_drain_waits(
        self, fresh: JobDriver
    ) -> None:
        driver = fresh
        assert driver.acks is not None
        async with open_jobs(driver, jobs=[noop]) as jobs:
            await noop.enqueue_many(range(3))
            inner = driver.acks.ack_many
            sending = trio.Event()
            release = trio.Event()

            async def held_back(acks: Any) -> list[bool]:
                sending.set()
                await release.wait()
                return await inner(acks)

            driver.acks.ack_many = held_back  # type: ignore[method-assign]
            worker = Worker(jobs, concurrency=1, drain_timeout="30s")
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await sending.wait()

                async def three_held() -> bool:
                    return worker.stats().in_flight == 3

                # Waited for, not slept on: a loaded box may take longer than any sleep.
                await _until(three_held)
                # The body returned, its ack is held back: its room goes to the next
                # claims (one slot: the bodies ran one after another), and every
                # row is still running until its ack lands.
                assert worker.stats().done == 0
                assert [v.state for v in await _views(driver)] == ["running"] * 3
                nursery.start_soon(worker.drain)
                await trio.sleep(0.3)
                release.set()
            views = await _views(driver)
        # The drain waited for the acks' answers: the jobs are done, not handed back.
        assert worker.stats().done == 3
        assert worker.stats().drained == 0
        assert [v.state for v in views] == ["done"] * 3
