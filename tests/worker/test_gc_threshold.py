"""While a worker runs, the garbage collector's youngest generation is collected
every 10,000 net allocations instead of CPython's 700 (``Worker(...,
gc_young_threshold=)``): raised only if lower, put back by the last running
worker, left alone with ``None`` or when the app changed it meanwhile.

Real workers over the memory driver on Trio's MockClock; each test starts from
CPython's default thresholds and puts back what it found.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for
from trio_jobs import ErrorCode, JobsError, Worker, job

CPYTHON = (700, 10, 10)


@pytest.fixture(autouse=True)
def _default_thresholds() -> Iterator[None]:
    found = gc.get_threshold()
    gc.set_threshold(*CPYTHON)
    try:
        yield
    finally:
        gc.set_threshold(*found)


def _recording_job(seen: list[tuple[int, ...]]) -> Any:
    @job(input=Item, idempotency_key=lambda i: i.key, name="gc-seen")
    async def gc_seen(ctx: Any) -> None:
        seen.append(gc.get_threshold())

    return gc_seen


async def test_a_running_worker_raises_the_young_threshold_and_the_end_puts_it_back(
    autojump_clock: Any,
) -> None:
    seen: list[tuple[int, ...]] = []
    handle = _recording_job(seen)
    async with jobs_on_memory([handle]) as (jobs, _):
        await handle.enqueue(Item("a"))
        async with running_worker(jobs) as w:
            await wait_for(lambda: w.stats().done == 1)
            assert gc.get_threshold() == (10_000, 10, 10)
        assert gc.get_threshold() == CPYTHON
    # The body ran under the raised threshold; the older generations' are kept.
    assert seen == [(10_000, 10, 10)]


async def test_none_leaves_the_collector_alone(autojump_clock: Any) -> None:
    seen: list[tuple[int, ...]] = []
    handle = _recording_job(seen)
    async with jobs_on_memory([handle]) as (jobs, _):
        await handle.enqueue(Item("a"))
        async with running_worker(jobs, gc_young_threshold=None) as w:
            await wait_for(lambda: w.stats().done == 1)
    assert seen == [CPYTHON]
    assert gc.get_threshold() == CPYTHON


async def test_a_threshold_the_app_set_higher_is_kept(autojump_clock: Any) -> None:
    gc.set_threshold(50_000, 20, 5)
    async with jobs_on_memory([]) as (jobs, _):
        async with running_worker(jobs, gc_young_threshold=1_000):
            assert gc.get_threshold() == (50_000, 20, 5)
    assert gc.get_threshold() == (50_000, 20, 5)


async def test_a_chosen_threshold_is_the_one_set(autojump_clock: Any) -> None:
    async with jobs_on_memory([]) as (jobs, _):
        async with running_worker(jobs, gc_young_threshold=2_500):
            assert gc.get_threshold() == (2_500, 10, 10)
    assert gc.get_threshold() == CPYTHON


async def test_overlapping_workers_put_it_back_when_the_last_ends(autojump_clock: Any) -> None:
    async with jobs_on_memory([]) as (jobs, _):
        async with running_worker(jobs):
            async with running_worker(jobs):
                assert gc.get_threshold()[0] == 10_000
            # The first is still running: still raised.
            assert gc.get_threshold()[0] == 10_000
        assert gc.get_threshold() == CPYTHON
        # A later worker raises it again.
        async with running_worker(jobs):
            assert gc.get_threshold()[0] == 10_000
    assert gc.get_threshold() == CPYTHON


async def test_a_threshold_the_app_changed_while_it_ran_is_left_as_the_app_set_it(
    autojump_clock: Any,
) -> None:
    async with jobs_on_memory([]) as (jobs, _):
        async with running_worker(jobs):
            gc.set_threshold(3_000, 10, 10)
    assert gc.get_threshold() == (3_000, 10, 10)


async def test_a_cancelled_run_puts_it_back(autojump_clock: Any) -> None:
    async with jobs_on_memory([]) as (jobs, _):
        worker = Worker(jobs)
        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                assert gc.get_threshold()[0] == 10_000
                await trio.sleep_forever()
    assert gc.get_threshold() == CPYTHON


async def test_run_until_quiet_raises_it_for_its_pass(autojump_clock: Any) -> None:
    seen: list[tuple[int, ...]] = []
    handle = _recording_job(seen)
    async with jobs_on_memory([handle]) as (jobs, _):
        await handle.enqueue(Item("a"))
        await Worker(jobs).run_until_quiet()
    assert seen == [(10_000, 10, 10)]
    assert gc.get_threshold() == CPYTHON


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10000"])
async def test_a_bad_threshold_is_refused_before_anything_runs(
    bad: Any, autojump_clock: Any
) -> None:
    async with jobs_on_memory([]) as (jobs, _):
        with pytest.raises(JobsError) as caught:
            Worker(jobs, gc_young_threshold=bad)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    assert "gc_young_threshold" in str(caught.value)
    assert gc.get_threshold() == CPYTHON


def test_workers_on_loops_in_two_threads_share_one_raise() -> None:
    """Two Trio loops in two threads, each running a worker that overlaps the
    other's: the threshold is raised while either runs and put back once both
    have ended (the count of holders is the process's, under a lock)."""
    import threading

    from jobs_support import jobs_on_memory as _on_memory

    first_running = threading.Event()
    second_done = threading.Event()
    seen: dict[str, int] = {}

    async def first() -> None:
        async with _on_memory([]) as (jobs, _):
            worker = Worker(jobs, poll_interval="10ms")
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                first_running.set()
                await trio.to_thread.run_sync(second_done.wait)
                seen["first, after the second ended"] = gc.get_threshold()[0]
                await worker.drain()

    async def second() -> None:
        await trio.to_thread.run_sync(first_running.wait)
        async with _on_memory([]) as (jobs, _):
            worker = Worker(jobs, poll_interval="10ms")
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                seen["second, while both ran"] = gc.get_threshold()[0]
                await worker.drain()

    def run_second() -> None:
        try:
            trio.run(second)
        finally:
            second_done.set()

    thread = threading.Thread(target=run_second)
    thread.start()
    trio.run(first)
    thread.join()
    assert seen == {"second, while both ran": 10_000, "first, after the second ended": 10_000}
    assert gc.get_threshold() == CPYTHON
