"""The worker claims ahead of need (``Worker(prefetch=)``) and its ack pipeline
frees a slot before the ack lands: a queue holds its slots' bodies, a bounded
extra claimed and not started, and the acks in flight; never more bodies at
once than its slots, and a drain hands the unstarted ones back uncounted.

Real workers over the memory driver on Trio's MockClock.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

from jobs_support import Item, jobs_on_memory, running_worker, wait_for
from trio_jobs import ErrorCode, JobsError, Worker
from trio_jobs.drivers.memory import MemoryDriver

from .test_worker import Gates, gated_job


async def _running_rows(driver: MemoryDriver, queue: str = "default") -> int:
    return sum(s.running for s in await driver.stats() if s.queue == queue)


class TestClaimAhead:
    async def test_a_queue_claims_its_prefetch_while_its_bodies_run(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            for n in range(10):
                await gated.enqueue(Item(f"k{n}"))
            async with running_worker(jobs, concurrency=2, prefetch=3) as w:
                await wait_for(lambda: gates.running["default"] == 2)
                await trio.sleep(5)
                # Two bodies run; three more rows are claimed for when they end.
                assert await _running_rows(driver) == 5
                stats = w.stats()
                assert (stats.in_flight, stats.prefetched) == (2, 3)
                assert gates.running["default"] == 2
                gates.open_all(f"k{n}" for n in range(10))
                await wait_for(lambda: w.stats().done == 10)
            assert gates.peak["default"] == 2
            assert sorted(gates.started) == sorted(f"k{n}" for n in range(10))

    async def test_by_default_a_queue_of_quick_jobs_claims_ahead(self, autojump_clock: Any) -> None:
        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            quick = [f"q{n}" for n in range(6)]
            gates.open_all(quick)  # these bodies return at once
            for key in quick:
                await gated.enqueue(Item(key))
            async with running_worker(jobs, concurrency=3) as w:
                await wait_for(lambda: w.stats().done == 6)
                for n in range(10):
                    await gated.enqueue(Item(f"k{n}"))
                await wait_for(lambda: gates.running["default"] == 3)
                await trio.sleep(5)
                # Three bodies run; the rest are claimed for when they end
                # (quick jobs: up to PREFETCH_AHEAD of the slots' work, at
                # least the slots, at most PREFETCH_MAX).
                assert await _running_rows(driver) == 10
                assert w.stats().prefetched == 7
                gates.open_all(f"k{n}" for n in range(10))
                await wait_for(lambda: w.stats().done == 16)
            assert gates.peak["default"] == 3

    async def test_by_default_long_jobs_are_not_claimed_ahead(self, autojump_clock: Any) -> None:
        # A job claimed ahead waits about one attempt for its slot: for long
        # jobs another worker should have them.
        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            for n in range(10):
                await gated.enqueue(Item(f"k{n}"))
            async with running_worker(jobs, concurrency=3) as w:
                await wait_for(lambda: gates.running["default"] == 3)
                await trio.sleep(5)
                gates.open_all(["k0", "k1", "k2"])  # (each held its slot 5 s)
                await wait_for(lambda: w.stats().done == 3 and gates.running["default"] == 3)
                await trio.sleep(5)
                assert await _running_rows(driver) == 3
                assert w.stats().prefetched == 0
                gates.open_all(f"k{n}" for n in range(10))
                await wait_for(lambda: w.stats().done == 10)

    async def test_by_default_a_slow_paced_worker_claims_less_ahead(
        self, autojump_clock: Any
    ) -> None:
        # Quick attempts (10 ms a slot) would be claimed 5x the slots ahead; a
        # worker finishing only one every 100 ms (its share of a fleet) holds
        # no more than PREFETCH_PACE of its own pace: the other claimers' rows.
        async with jobs_on_memory([]) as (jobs, _driver):
            fast = Worker(jobs, concurrency=2)
            slow = Worker(jobs, concurrency=2)
            for worker, every in ((fast, 0.001), (slow, 0.1)):
                for _ in range(100):
                    worker._took_slot("default", 0.01)
                    await trio.sleep(every)
            assert fast._prefetch_of("default") == 10  # 2 slots x 50 ms / 10 ms
            # about 0.25 s / 100 ms, floored at the slots
            assert slow._prefetch_of("default") == 2

    async def test_prefetch_zero_claims_only_free_slots(self, autojump_clock: Any) -> None:
        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            for n in range(6):
                await gated.enqueue(Item(f"k{n}"))
            async with running_worker(jobs, concurrency=2, prefetch=0) as w:
                await wait_for(lambda: gates.running["default"] == 2)
                await trio.sleep(5)
                assert await _running_rows(driver) == 2
                assert w.stats().prefetched == 0
                gates.open_all(f"k{n}" for n in range(6))
                await wait_for(lambda: w.stats().done == 6)

    async def test_max_in_flight_caps_what_is_claimed_ahead(self, autojump_clock: Any) -> None:
        # A worker at the process cap claims nothing (the spec's maxInFlight).
        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            for n in range(8):
                await gated.enqueue(Item(f"k{n}"))
            async with running_worker(jobs, concurrency=4, max_in_flight=2, prefetch=4) as w:
                await wait_for(lambda: gates.running["default"] == 2)
                await trio.sleep(5)
                assert await _running_rows(driver) == 2
                gates.open_all(f"k{n}" for n in range(8))
                await wait_for(lambda: w.stats().done == 8)
            assert gates.peak["default"] == 2

    async def test_prefetched_jobs_wait_for_a_slot_of_their_own_queue(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        in_a, in_b = gated_job(gates, queue="a"), gated_job(gates, queue="b")
        async with jobs_on_memory([in_a, in_b]) as (jobs, driver):
            for n in range(6):
                await in_a.enqueue(Item(f"a{n}"))
                await in_b.enqueue(Item(f"b{n}"))
            async with running_worker(
                jobs, queues=["a", "b"], concurrency={"a": 1, "b": 3}, prefetch=2
            ) as w:
                await wait_for(lambda: gates.running["a"] == 1 and gates.running["b"] == 3)
                await trio.sleep(5)
                # Queue b's free slot tasks never start a's claimed-ahead jobs.
                assert (gates.running["a"], gates.running["b"]) == (1, 3)
                assert await _running_rows(driver, "a") == 3
                assert await _running_rows(driver, "b") == 5
                # b's bodies end: a still runs one at a time.
                gates.open_all(f"b{n}" for n in range(6))
                await wait_for(lambda: w.stats().done == 6)
                await trio.sleep(5)
                assert gates.running["a"] == 1
                gates.open_all(f"a{n}" for n in range(6))
                await wait_for(lambda: w.stats().done == 12)
            assert dict(gates.peak) == {"a": 1, "b": 3}

    async def test_a_drain_hands_unstarted_jobs_back_uncounted_at_once(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            ids = [(await gated.enqueue(Item(f"k{n}"))).id for n in range(3)]
            worker = Worker(jobs, concurrency=1, prefetch=2, drain_timeout="60s")
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await wait_for(lambda: gates.running["default"] == 1)
                await trio.sleep(5)
                assert worker.stats().prefetched == 2
                nursery.start_soon(worker.drain)
                # Back before the running body has answered its abort.
                await trio.sleep(0.5)
                intro = driver.introspect
                assert intro is not None
                for job_id in ids[1:]:
                    view = await intro.show(job_id)
                    assert (view.state, view.attempts) == ("ready", 0)
            assert gates.started == ["k0"]
            assert worker.stats().drained == 3

    async def test_a_bad_prefetch_is_refused(self, autojump_clock: Any) -> None:
        gated = gated_job(Gates())
        async with jobs_on_memory([gated]) as (jobs, _driver):
            for value in (-1, 1.5, True, "2"):
                with pytest.raises(JobsError) as err:
                    Worker(jobs, prefetch=value)
                assert err.value.code == ErrorCode.X_CONFIG_INVALID
                assert "prefetch" in err.value.message


@contextlib.asynccontextmanager
async def _thawing(clock: trio.testing.MockClock) -> AsyncIterator[None]:
    """Time jumps to the next timer once the block is left, pass or fail: the
    worker's drain has its timers."""
    try:
        yield
    finally:
        clock.autojump_threshold = 0


class TestAcksLeaveTheRoom:
    async def test_the_memory_driver_batches_the_slots_acks(self, autojump_clock: Any) -> None:
        from trio_jobs import JobContext, job

        @job(input=Item, idempotency_key=lambda i: i.key, name="noop")
        async def noop(ctx: JobContext[Item]) -> None:
            return None

        async with jobs_on_memory([noop]) as (jobs, driver):
            sink = driver.acks
            assert sink is not None
            batches: list[int] = []
            real = sink.ack_many

            async def spy(acks: Any) -> list[bool]:
                batches.append(len(acks))
                return await real(acks)

            sink.ack_many = spy  # type: ignore[method-assign]
            for n in range(40):
                await noop.enqueue(Item(f"k{n}"))
            async with running_worker(jobs, concurrency=8) as w:
                await wait_for(lambda: w.stats().done == 40)
            assert sum(batches) == 40
            assert max(batches) > 1  # acks of several slots share a call

    async def test_a_small_batch_waits_for_the_ack_call_in_flight_and_goes_whole(
        self, mock_clock: Any
    ) -> None:
        # Frozen clock (time moves only when the test jumps it): what the
        # pipeline sends depends on the calls' answers alone.
        from trio.testing import wait_all_tasks_blocked

        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            sink = driver.acks
            assert sink is not None
            held_up = trio.Event()
            batches: list[list[str]] = []
            real = sink.ack_many

            async def slow(acks: Any) -> list[bool]:
                batches.append([job_id for job_id, _options in acks])
                await held_up.wait()
                return await real(acks)

            sink.ack_many = slow  # type: ignore[method-assign]
            keys = [f"k{n}" for n in range(5)]
            for key in keys:
                await gated.enqueue(Item(key))
            async with running_worker(jobs, concurrency=8) as w, _thawing(mock_clock):
                await wait_all_tasks_blocked()
                assert len(gates.started) == 5
                gates.open("k0")
                await wait_all_tasks_blocked()
                assert [len(b) for b in batches] == [1]
                # Four more acks while the first call is in flight: they wait
                # for its answer (main sent the first of them alone at once).
                gates.open_all(keys[1:])
                await wait_all_tasks_blocked()
                assert [len(b) for b in batches] == [1]
                held_up.set()
                await wait_all_tasks_blocked()
                assert [len(b) for b in batches] == [1, 4]
                assert w.stats().done == 5

    async def test_a_held_ack_goes_after_ack_hold_seconds_while_the_call_is_still_in_flight(
        self, mock_clock: Any
    ) -> None:
        from trio.testing import wait_all_tasks_blocked

        from trio_jobs._worker import ACK_HOLD

        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            sink = driver.acks
            assert sink is not None
            first_held = trio.Event()
            batches: list[int] = []
            real = sink.ack_many

            async def slow(acks: Any) -> list[bool]:
                batches.append(len(acks))
                if len(batches) == 1:
                    await first_held.wait()
                return await real(acks)

            sink.ack_many = slow  # type: ignore[method-assign]
            for key in ("k0", "k1"):
                await gated.enqueue(Item(key))
            async with running_worker(jobs, concurrency=8) as w, _thawing(mock_clock):
                await wait_all_tasks_blocked()
                gates.open("k0")
                await wait_all_tasks_blocked()
                gates.open("k1")
                await wait_all_tasks_blocked()
                assert batches == [1]
                mock_clock.jump(ACK_HOLD * 0.9)
                await wait_all_tasks_blocked()
                assert batches == [1]
                mock_clock.jump(ACK_HOLD * 0.2)
                await wait_all_tasks_blocked()
                # The hold is bounded: the second ack went in a call of its
                # own, the first still unanswered.
                assert batches == [1, 1]
                assert w.stats().done == 1
                first_held.set()
                await wait_all_tasks_blocked()
                assert w.stats().done == 2

    async def test_a_drain_sends_a_held_ack_at_once(self, mock_clock: Any) -> None:
        # The hold never delays a drain: once the slots are done, what the
        # pipeline holds goes now, not ACK_HOLD later (the clock stands still).
        from trio.testing import wait_all_tasks_blocked

        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            sink = driver.acks
            assert sink is not None
            first_held = trio.Event()
            batches: list[int] = []
            real = sink.ack_many

            async def slow(acks: Any) -> list[bool]:
                batches.append(len(acks))
                if len(batches) == 1:
                    await first_held.wait()
                return await real(acks)

            sink.ack_many = slow  # type: ignore[method-assign]
            for key in ("k0", "k1"):
                await gated.enqueue(Item(key))
            async with trio.open_nursery() as nursery:
                async with running_worker(jobs, concurrency=8) as w, _thawing(mock_clock):
                    await wait_all_tasks_blocked()
                    gates.open("k0")
                    await wait_all_tasks_blocked()
                    gates.open("k1")
                    await wait_all_tasks_blocked()
                    assert batches == [1]  # k1's ack is held
                    nursery.start_soon(w.drain)
                    await wait_all_tasks_blocked()
                    assert batches == [1, 1]
                    first_held.set()
                    await wait_all_tasks_blocked()
                    assert w.stats().done == 2
                    assert w.stats().drained == 0

    async def test_a_slot_runs_its_next_job_while_the_last_ones_ack_is_in_flight(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        gated = gated_job(gates)
        async with jobs_on_memory([gated]) as (jobs, driver):
            sink = driver.acks
            assert sink is not None
            held_up = trio.Event()
            real = sink.ack_many

            async def slow(acks: Any) -> list[bool]:
                await held_up.wait()
                return await real(acks)

            sink.ack_many = slow  # type: ignore[method-assign]
            for n in range(3):
                await gated.enqueue(Item(f"k{n}"))
            async with running_worker(jobs, concurrency=1, prefetch=0) as w:
                gates.open_all(["k0", "k1", "k2"])
                # The next body ran, one at a time, with no ack answered yet...
                await wait_for(lambda: len(gates.started) == 2)
                assert w.stats().done == 0
                # ... and no more: the acks in flight hold at most the queue's slots.
                await trio.sleep(3)  # (within the acks' write budget)
                assert len(gates.started) == 2
                assert gates.peak["default"] == 1
                held_up.set()
                await wait_for(lambda: w.stats().done == 3)
