"""The slot loop: a slot task runs attempt after attempt.

The claimer hands each claimed job to a parked slot task instead of spawning a
task per job, so a worker of N slots runs every job on at most N tasks. Each
attempt still starts from the slot's pristine ``contextvars`` context (nothing a
body sets leaks into the next job), and the body and its ack share one cancel
scope: an abort that arrives once the body has returned (a drain) does not
cancel the ack in flight.

Every test drives a real Worker over the memory driver on Trio's MockClock.
"""

from __future__ import annotations

import contextvars
from typing import Any

import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import JobContext, Retry, Worker, job
from trio_jobs._context import WRITE_BUDGET

_seen_tasks: list[trio.lowlevel.Task] = []
_leak: contextvars.ContextVar[str] = contextvars.ContextVar("leak")
_leak_seen: list[str] = []


@job(input=Item, idempotency_key=lambda i: i.key, name="slots.who")
async def who(ctx: JobContext[Item]) -> None:
    _seen_tasks.append(trio.lowlevel.current_task())  # held: ids stay unique
    await trio.sleep(0.01)


@job(input=Item, idempotency_key=lambda i: i.key, name="slots.leaky")
async def leaky(ctx: JobContext[Item]) -> None:
    _leak_seen.append(_leak.get("unset"))
    _leak.set(f"set by {ctx.input.key}")  # before any checkpoint...
    await trio.sleep(0.01)
    _leak.set(f"set again by {ctx.input.key}")  # ...and after one


async def test_n_slots_run_every_job_on_at_most_n_tasks(autojump_clock: Any) -> None:
    _seen_tasks.clear()
    async with jobs_on_memory([who]) as (jobs, _driver):
        await who.enqueue_many([Item(f"k{n}") for n in range(60)])
        async with running_worker(jobs, concurrency=3) as worker:
            await wait_for(lambda: worker.stats().done == 60)
    assert len(_seen_tasks) == 60
    assert len({id(t) for t in _seen_tasks}) <= 3  # a task per job gave 60
    assert worker._slot_tasks == 0  # every slot task ended with the worker


async def test_a_contextvar_a_body_sets_does_not_reach_the_next_job(autojump_clock: Any) -> None:
    _leak_seen.clear()
    async with jobs_on_memory([leaky]) as (jobs, _driver):
        await leaky.enqueue_many([Item(f"k{n}") for n in range(5)])
        async with running_worker(jobs, concurrency=1) as worker:
            await wait_for(lambda: worker.stats().done == 5)
    assert _leak_seen == ["unset"] * 5


async def test_a_drain_after_the_body_returned_does_not_cancel_its_ack(
    autojump_clock: Any,
) -> None:
    @job(input=Item, idempotency_key=lambda i: i.key, name="slots.quick")
    async def quick(ctx: JobContext[Item]) -> str:
        return "ok"

    async with jobs_on_memory([quick]) as (jobs, driver):
        acking = trio.Event()
        release = trio.Event()
        real_ack = driver.ack

        async def slow_ack(job_id: str, options: Any) -> bool:
            acking.set()
            await release.wait()  # the ack is in flight when the drain begins
            return bool(await real_ack(job_id, options))

        driver.ack = slow_ack
        enq = await quick.enqueue(Item("a"))
        worker = Worker(jobs, drain_timeout="30s")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await acking.wait()
            nursery.start_soon(worker.drain)
            await trio.sleep(1)
            release.set()
        view = await wait_state(jobs, enq.id, "done")
    assert (view.state, view.attempts) == ("done", 1)
    assert worker.stats().done == 1
    assert worker.stats().drained == 0


async def test_a_stopped_worker_leaves_no_parked_slot_behind(autojump_clock: Any) -> None:
    async with jobs_on_memory([who]) as (jobs, _driver):
        await who.enqueue_many([Item(f"p{n}") for n in range(10)])
        worker = Worker(jobs, concurrency=4)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await wait_for(lambda: worker.stats().done == 10)
                assert worker._parked  # idle slot tasks wait for work...
                await worker.drain()
        # ...and ended with the worker (the nursery closed: nothing left parked).
        assert worker._parked == []
        assert worker._slot_tasks == 0


async def test_attempts_queued_past_the_slot_tasks_run_on_the_busy_ones(
    autojump_clock: Any, monkeypatch: Any
) -> None:
    # The claimer claims only free room, so a claimed attempt finds a parked slot
    # task or room to start one; the queue behind them is a safety net. Force it:
    # one slot task for three slots' claims.
    _seen_tasks.clear()
    _leak_seen.clear()
    monkeypatch.setattr(Worker, "_capacity", lambda self: 1)
    async with jobs_on_memory([who, leaky]) as (jobs, _driver):
        await who.enqueue_many([Item(f"q{n}") for n in range(6)])
        await leaky.enqueue_many([Item(f"l{n}") for n in range(3)])
        async with running_worker(jobs, concurrency=3) as worker:
            await wait_for(lambda: worker.stats().done == 9)
    assert len({id(t) for t in _seen_tasks}) == 1
    assert _leak_seen == ["unset"] * 3  # a fresh context on the queued path too


# A slot task keeps one cancel scope across attempts (a fresh one only after a
# cancel): what one attempt put on it must never reach the next.

_ran: list[str] = []


@job(input=Item, idempotency_key=lambda i: i.key, name="slots.quick_with_timeout", timeout="1s")
async def quick_with_timeout(ctx: JobContext[Item]) -> None:
    _ran.append(f"quick {ctx.input.key}")


@job(input=Item, idempotency_key=lambda i: i.key, name="slots.long", retry=Retry(attempts=1))
async def long(ctx: JobContext[Item]) -> None:
    # Longer than the previous attempt's timeout and than an ack's write budget.
    await trio.sleep(WRITE_BUDGET + 5)
    _ran.append(f"long {ctx.input.key}")


@job(
    input=Item,
    idempotency_key=lambda i: i.key,
    name="slots.times_out",
    timeout="1s",
    retry=Retry(attempts=1),
)
async def times_out(ctx: JobContext[Item]) -> None:
    await trio.sleep(60)


async def test_the_next_attempt_on_a_slot_gets_neither_the_timeout_nor_the_budget_of_the_last(
    autojump_clock: Any,
) -> None:
    _ran.clear()
    _seen_tasks.clear()
    async with jobs_on_memory([quick_with_timeout, long, who]) as (jobs, _driver):
        async with running_worker(jobs, concurrency=1) as worker:
            for n in range(3):
                await quick_with_timeout.enqueue(Item(f"q{n}"))
                await wait_for(lambda n=n: f"quick q{n}" in _ran)
                await who.enqueue(Item(f"w{n}"))  # the slot's task, noted
                await wait_for(lambda n=n: len(_seen_tasks) == n + 1)
                enq = await long.enqueue(Item(f"l{n}"))
                view = await wait_state(jobs, enq.id, "done", "dead", "failed")
                assert (view.state, view.attempts) == ("done", 1), view.last_error
    assert len({id(t) for t in _seen_tasks}) == 1  # one slot task ran them all
    assert worker.stats().done == 9


async def test_a_timed_out_attempt_leaves_the_next_one_on_its_slot_untouched(
    autojump_clock: Any,
) -> None:
    _ran.clear()
    async with jobs_on_memory([times_out, long]) as (jobs, _driver):
        async with running_worker(jobs, concurrency=1) as worker:
            first = await times_out.enqueue(Item("t"))
            view = await wait_state(jobs, first.id, "dead", "failed")
            assert view.last_error is not None
            assert "X_JOB_TIMEOUT" in view.last_error
            enq = await long.enqueue(Item("after"))
            view = await wait_state(jobs, enq.id, "done", "dead", "failed")
    assert (view.state, view.attempts) == ("done", 1)
    assert _ran == ["long after"]
    assert worker.stats().dead_lettered == 1
