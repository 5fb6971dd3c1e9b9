"""Settles and step records ride out a short driver outage (``_write_retry.py``).

A settle (ack, a retry's or a hand-back's nack) or a step record that meets
``X_DRIVER_UNAVAILABLE`` is retried with capped exponential backoff and jitter,
inside the 10 s write budget and only while the claim's lease holds as the
worker knows it. Before, the write was given up at once: the row stayed
``running`` until its lease lapsed and the job was redelivered with an attempt
counted (25-30 times per chaos soak, ``simulation/SOAK.md``).

Every test drives a real Worker over the memory driver on Trio's MockClock; the
outage is a wrapper that fails the driver's calls with ``X_DRIVER_UNAVAILABLE``
before they reach it (the real-database versions, with real disconnects, are in
``tests/drivers/postgres/test_write_retry.py``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio

import trio_jobs.logging as tj_logging
from jobs_support import Item, events_named, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import JobContext, Retry, job
from trio_jobs._context import WRITE_BUDGET
from trio_jobs._write_retry import RETRY_BASE, RETRY_CAP, retry_delay, retry_transient
from trio_jobs.errors import ErrorCode, JobsError

#: A payload value: it must never reach a log record.
SECRET = "tok_live_SECRET_retry"


class Outage:
    """The driver is unreachable while ``down`` (or for the next ``fail[name]``
    calls of a method): the wrapped calls raise ``X_DRIVER_UNAVAILABLE`` before
    they reach the driver, as a refused connection does. ``lose[name]`` calls
    land first and then raise: the answer of a write that committed is lost."""

    METHODS = ("ack", "nack", "heartbeat", "claim")

    def __init__(self, driver: Any, *, steps: bool = True) -> None:
        self.down = False
        self.calls: Counter[str] = Counter()
        self.reached: Counter[str] = Counter()
        self.fail: Counter[str] = Counter()
        self.lose: Counter[str] = Counter()
        self.refused_at: list[tuple[str, float]] = []
        for name in self.METHODS:
            setattr(driver, name, self._wrap(name, getattr(driver, name)))
        if steps:
            for name in ("put", "load"):
                setattr(
                    driver.steps, name, self._wrap(f"steps.{name}", getattr(driver.steps, name))
                )

    def _wrap(
        self, name: str, real: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any) -> Any:
            self.calls[name] += 1
            if self.down or self.fail[name] > 0:
                if self.fail[name] > 0:
                    self.fail[name] -= 1
                self.refused_at.append((name, trio.current_time()))
                raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the database is away")
            self.reached[name] += 1
            result = await real(*args)
            if self.lose[name] > 0:
                self.lose[name] -= 1
                raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the answer was lost")
            return result

        return call


def check_retry_event(record: Any, job_id: str) -> dict[str, Any]:
    """A retry record is catalogued, at its level, with the job's fields and no value."""
    event = record.event
    level, catalogued, _meaning = tj_logging.EVENTS[event]
    assert record.levelname.lower() == level == "warning"
    fields = tj_logging.fields_of(record)
    assert set(fields) == set(catalogued), (event, fields)
    assert fields["job_id"] == job_id
    assert isinstance(fields["attempt"], int)
    assert fields["code"] == ErrorCode.X_DRIVER_UNAVAILABLE
    assert fields["retry_in"] > 0
    rendered = tj_logging.JsonFormatter().format(record)
    assert SECRET not in rendered
    assert SECRET not in repr(record.__dict__)
    return fields


gate = trio.Event()
ran: list[str] = []


@job(input=Item, idempotency_key=lambda i: i.key, name="wr.quick")
async def quick(ctx: JobContext[Item]) -> dict[str, str]:
    ran.append(ctx.input.key)
    return {"echo": ctx.input.key}


@job(input=Item, idempotency_key=lambda i: i.key, name="wr.gated")
async def gated(ctx: JobContext[Item]) -> str:
    ran.append(ctx.input.key)
    await gate.wait()
    return "ok"


@job(input=Item, idempotency_key=lambda i: i.key, name="wr.steps")
async def stepped(ctx: JobContext[Item]) -> int:
    async def effect() -> int:
        ran.append(ctx.input.key)
        return 7

    return int(await ctx.step.run("effect", effect)) + 1


@job(
    input=Item,
    idempotency_key=lambda i: i.key,
    name="wr.flaky",
    retry=Retry(attempts=3, base="1s", max_delay="1s"),
)
async def flaky(ctx: JobContext[Item]) -> str:
    ran.append(f"{ctx.input.key}:{ctx.attempt}")
    if ctx.attempt == 1:
        raise JobsError("X_FLAKY", "first attempt fails")
    return "ok"


@job(input=Item, idempotency_key=lambda i: i.key, name="wr.sleeper")
async def sleeper(ctx: JobContext[Item]) -> str:
    ran.append(f"{ctx.input.key}:{ctx.attempt}")
    await ctx.step.sleep("5s")
    return "woke"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global gate
    gate = trio.Event()
    ran.clear()


# --------------------------------------------------------------------------- the policy


def test_the_backoff_doubles_from_the_base_to_the_cap_with_jitter() -> None:
    for key in ("a:1", "b:2", "c:3"):
        delays = [retry_delay(key, n) for n in range(1, 12)]
        for n, delay in enumerate(delays, start=1):
            ceiling = min(RETRY_CAP, RETRY_BASE * 2 ** (n - 1))
            assert ceiling * 0.5 <= delay < ceiling
        assert delays == [retry_delay(key, n) for n in range(1, 12)]  # replayable
    # the jitter spreads slots that retry after one outage
    assert len({round(retry_delay(f"job-{i}:1", 3), 6) for i in range(50)}) > 40
    assert retry_delay("x:1", 10_000) < RETRY_CAP


async def test_retry_transient_stops_at_the_deadline_and_when_the_lease_is_gone(
    autojump_clock: Any, caplog: Any
) -> None:
    tries: list[float] = []

    async def down() -> bool:
        tries.append(trio.current_time())
        raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "away")

    start = trio.current_time()
    first = JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "away")
    with pytest.raises(JobsError) as err:
        await retry_transient(
            down,
            first,
            deadline=start + 3.0,
            gone=lambda: False,
            key="k",
            event="jobs.settle.retry",
            fields={"job_id": "j", "attempt": 1, "worker_id": "w", "write": "ack"},
        )
    assert err.value.code == ErrorCode.X_DRIVER_UNAVAILABLE
    assert tries
    assert all(t < start + 3.0 for t in tries)
    # it stopped because the next wait would have crossed the deadline
    assert tries[-1] + retry_delay("k", len(tries) + 1) >= start + 3.0
    assert len(events_named(caplog, "jobs.settle.retry")) == len(tries)

    tries.clear()
    lost_at = trio.current_time() + 0.5
    with pytest.raises(JobsError):
        await retry_transient(
            down,
            first,
            deadline=trio.current_time() + 10.0,
            gone=lambda: trio.current_time() >= lost_at,
            key="k",
            event="jobs.settle.retry",
            fields={"job_id": "j", "attempt": 1, "worker_id": "w", "write": "ack"},
        )
    assert tries
    assert all(t < lost_at for t in tries)
    assert trio.current_time() < lost_at + RETRY_CAP

    async def refused() -> bool:
        raise JobsError(ErrorCode.X_INVARIANT, "not transient")

    with pytest.raises(JobsError) as err:
        await retry_transient(
            refused,
            first,
            deadline=trio.current_time() + 10.0,
            gone=lambda: False,
            key="k",
            event="jobs.settle.retry",
            fields={"job_id": "j", "attempt": 1, "worker_id": "w", "write": "ack"},
        )
    assert err.value.code == ErrorCode.X_INVARIANT


def test_the_retry_events_are_catalogued() -> None:
    for event in ("jobs.settle.retry", "jobs.step.retry"):
        level, fields, meaning = tj_logging.EVENTS[event]
        assert level == "warning"
        assert set(tj_logging.JOB_FIELDS) <= set(fields)
        assert {"worker_id", "retry", "retry_in"} <= set(fields)
        assert "X_DRIVER_UNAVAILABLE" in meaning
    assert "write" in tj_logging.EVENTS["jobs.settle.retry"][1]


# --------------------------------------------------------------------------- settles


async def test_an_ack_that_meets_a_short_outage_lands_without_a_redelivery(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([quick]) as (jobs, driver):
        outage = Outage(driver)
        outage.fail["ack"] = 3
        enq = await quick.enqueue(Item(SECRET))
        async with running_worker(jobs, visibility_timeout="30s") as worker:
            view = await wait_state(jobs, enq.id, "done")
            assert worker.stats().done == 1
        assert (view.attempts, view.result) == (1, {"echo": SECRET})
        assert ran == [SECRET]  # never redelivered
        assert outage.calls["ack"] == 4
        assert outage.reached["ack"] == 1
        retries = events_named(caplog, "jobs.settle.retry")
        assert [check_retry_event(r, enq.id)["retry"] for r in retries] == [1, 2, 3]
        assert {tj_logging.fields_of(r)["write"] for r in retries} == {"ack"}
        assert not events_named(caplog, "jobs.settle.unowned")
        assert not events_named(caplog, "jobs.settle.failed")
        assert worker.stats().leases_lost == 0
        # the retries waited the policy's backoff, nothing more
        refused = [t for name, t in outage.refused_at if name == "ack"]
        waits = [round(b - a, 6) for a, b in itertools.pairwise(refused)]
        assert len(waits) == 2
        assert all(RETRY_BASE / 2 <= w <= RETRY_CAP for w in waits), waits


async def test_a_retry_nack_that_meets_an_outage_lands_and_counts_one_attempt(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([flaky]) as (jobs, driver):
        outage = Outage(driver)
        outage.fail["nack"] = 2
        enq = await flaky.enqueue(Item("f"))
        async with running_worker(jobs) as worker:
            view = await wait_state(jobs, enq.id, "done")
            assert (worker.stats().retried, worker.stats().done) == (1, 1)
        assert view.attempts == 2  # the failed attempt and the one that passed, no more
        assert ran == ["f:1", "f:2"]
        retries = events_named(caplog, "jobs.settle.retry")
        assert [tj_logging.fields_of(r)["write"] for r in retries] == ["nack", "nack"]
        assert not events_named(caplog, "jobs.settle.unowned")


async def test_a_sleep_hand_back_that_meets_an_outage_lands_uncounted(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([sleeper]) as (jobs, driver):
        outage = Outage(driver)
        outage.fail["nack"] = 2
        enq = await sleeper.enqueue(Item("s"))
        async with running_worker(jobs) as worker:
            view = await wait_state(jobs, enq.id, "done")
            assert worker.stats().done == 1
        assert view.attempts == 1  # the sleep gave its attempt back
        assert ran == ["s:1", "s:1"]  # the run and its resumption, not a redelivery
        assert len(events_named(caplog, "jobs.settle.retry")) == 2
        assert not events_named(caplog, "jobs.settle.unowned")


async def test_a_non_transient_settle_failure_is_not_retried(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([quick]) as (jobs, driver):
        real = driver.ack
        calls = 0

        async def refusing(job_id: str, options: Any) -> bool:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise JobsError(ErrorCode.X_INVARIANT, "a bug, not an outage")
            return await real(job_id, options)

        driver.ack = refusing
        enq = await quick.enqueue(Item("n"))
        async with running_worker(jobs, visibility_timeout="6s"):
            view = await wait_state(jobs, enq.id, "done")
        assert calls == 2  # the refused settle, then the redelivery's
        assert view.attempts == 2
        assert not events_named(caplog, "jobs.settle.retry")
        assert [
            tj_logging.fields_of(r)["code"] for r in events_named(caplog, "jobs.settle.failed")
        ] == [ErrorCode.X_INVARIANT]
        assert len(events_named(caplog, "jobs.settle.unowned")) == 1


async def test_a_closed_driver_is_not_retried(autojump_clock: Any, caplog: Any) -> None:
    async with jobs_on_memory([gated]) as (jobs, driver):
        outage = Outage(driver)
        await gated.enqueue(Item("c"))
        async with running_worker(jobs, visibility_timeout="30s") as worker:
            await wait_for(lambda: ran == ["c"])
            outage.down = True
            driver.closed = True  # X_DRIVER_UNAVAILABLE from a closed driver is final
            began = trio.current_time()
            gate.set()
            await wait_for(lambda: events_named(caplog, "jobs.settle.unowned"), step=0.001)
            assert trio.current_time() - began < RETRY_BASE / 2
            assert outage.calls["ack"] == 1
            driver.closed = False
            outage.down = False
            assert worker.stats().done == 0
        assert not events_named(caplog, "jobs.settle.retry")


# --------------------------------------------------------------------------- the budget


async def test_retries_stop_at_the_write_budget_and_the_run_is_redelivered(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([gated]) as (jobs, driver):
        outage = Outage(driver)
        enq = await gated.enqueue(Item("b"))
        # A long lease: the write budget is what ends the retries.
        async with running_worker(jobs, visibility_timeout="60s") as worker:
            await wait_for(lambda: ran == ["b"])
            outage.down = True
            began = trio.current_time()
            gate.set()
            await wait_for(lambda: events_named(caplog, "jobs.settle.unowned"))
            gave_up = trio.current_time()
            tries = [t for name, t in outage.refused_at if name == "ack"]
            assert len(tries) >= 5
            assert all(t - began < WRITE_BUDGET for t in tries)
            assert WRITE_BUDGET - RETRY_CAP <= gave_up - began <= WRITE_BUDGET + 0.05
            assert len(events_named(caplog, "jobs.settle.retry")) == len(tries) - 1
            assert len(events_named(caplog, "jobs.settle.failed")) == 1
            outage.down = False
            # The claims failed in the outage too, so the worker, once the database
            # answers, hands back the rows running under it that it no longer holds:
            # this one, uncounted, at once (before, its lease lapsed and the reap
            # counted the attempt).
            view = await wait_state(jobs, enq.id, "done")
            assert worker.stats().done == 1
            assert trio.current_time() - began < 60.0
        assert view.attempts == 1
        assert ran == ["b", "b"]
        assert len(events_named(caplog, "jobs.claim.orphans-released")) == 1


async def test_retries_stop_once_the_lease_is_surely_gone(autojump_clock: Any, caplog: Any) -> None:
    async with jobs_on_memory([gated]) as (jobs, driver):
        outage = Outage(driver)
        enq = await gated.enqueue(Item("l"))
        # A 3 s lease, shorter than the write budget: heartbeats fail in the
        # outage too, so the window closes 3 s after the last renewal that landed.
        async with running_worker(jobs, visibility_timeout="3s") as worker:
            await wait_for(lambda: ran == ["l"])
            outage.down = True
            began = trio.current_time()
            gate.set()
            await wait_for(lambda: events_named(caplog, "jobs.settle.unowned"))
            gave_up = trio.current_time()
            assert gave_up - began <= 3.0 + RETRY_CAP + 0.05
            tries = [t for name, t in outage.refused_at if name == "ack"]
            assert all(t - began < 3.0 for t in tries)
            assert worker.stats().leases_lost == 1
            outage.down = False
            view = await wait_state(jobs, enq.id, "done")
        assert view.attempts == 2


async def test_a_drain_during_the_retries_completes_within_the_budget(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([gated]) as (jobs, driver):
        outage = Outage(driver)
        enq = await gated.enqueue(Item("d"))
        async with running_worker(jobs, visibility_timeout="60s", drain_timeout="1s") as worker:
            await wait_for(lambda: ran == ["d"])
            outage.down = True
            gate.set()
            await wait_for(lambda: events_named(caplog, "jobs.settle.retry"))
            began = trio.current_time()
            await worker.drain()  # SIGTERM, with the database still down
            drained_in = trio.current_time() - began
        assert drained_in <= WRITE_BUDGET
        assert len(events_named(caplog, "jobs.settle.unowned")) == 1
        outage.down = False
        view = await jobs.show(enq.id)
        assert view.state == "running"  # its lease lapses and it is redelivered, as before


async def test_a_drain_during_a_short_outage_waits_for_the_settle_to_land(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([gated]) as (jobs, driver):
        outage = Outage(driver)
        enq = await gated.enqueue(Item("e"))
        async with running_worker(jobs, visibility_timeout="60s", drain_timeout="1s") as worker:
            await wait_for(lambda: ran == ["e"])
            outage.down = True
            gate.set()
            await wait_for(lambda: events_named(caplog, "jobs.settle.retry"))
            began = trio.current_time()

            async def back() -> None:
                await trio.sleep(2.0)
                outage.down = False

            async with trio.open_nursery() as nursery:
                nursery.start_soon(back)
                await worker.drain()
            drained_in = trio.current_time() - began
            assert (worker.stats().done, worker.stats().abandoned) == (1, 0)
        assert 2.0 <= drained_in <= 2.0 + RETRY_CAP + 0.05
        view = await jobs.show(enq.id)
        assert (view.state, view.attempts) == ("done", 1)
        assert not events_named(caplog, "jobs.settle.unowned")


# --------------------------------------------------------------------------- step records


async def test_a_step_record_that_meets_a_short_outage_lands(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([stepped]) as (jobs, driver):
        outage = Outage(driver)
        outage.fail["steps.put"] = 2
        enq = await stepped.enqueue(Item("p"))
        async with running_worker(jobs) as worker:
            view = await wait_state(jobs, enq.id, "done")
            assert worker.stats().done == 1
        assert (view.attempts, view.result) == (1, 8)
        assert ran == ["p"]  # the step's fn ran once
        steps = {s.name: s for s in view.steps}
        assert (steps["effect"].status, steps["effect"].executions) == ("completed", 1)
        retries = events_named(caplog, "jobs.step.retry")
        assert [check_retry_event(r, enq.id)["retry"] for r in retries] == [1, 2]


async def test_a_step_record_whose_answer_was_lost_is_read_back_not_written_twice(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([stepped]) as (jobs, driver):
        outage = Outage(driver)
        outage.lose["steps.put"] = 1
        enq = await stepped.enqueue(Item("q"))
        async with running_worker(jobs):
            view = await wait_state(jobs, enq.id, "done")
        assert view.attempts == 1
        assert ran == ["q"]
        # the put landed, its answer was lost; the retry read it back and stopped
        assert outage.reached["steps.put"] == 1
        assert outage.reached["steps.load"] == 1
        assert len(events_named(caplog, "jobs.step.retry")) == 1


@job(
    input=Item,
    idempotency_key=lambda i: i.key,
    name="wr.steps.once",
    retry=Retry(attempts=1),
)
async def stepped_once(ctx: JobContext[Item]) -> int:
    async def effect() -> int:
        ran.append(ctx.input.key)
        return 7

    return int(await ctx.step.run("effect", effect)) + 1


async def test_a_step_record_that_never_lands_hands_the_run_back_uncounted(
    autojump_clock: Any, caplog: Any
) -> None:
    # Issue 13: a fault of the library's own statement is not the body's failure.
    # Before, the record's X_DRIVER_UNAVAILABLE failed the attempt: with
    # attempts=1 the job was dead-lettered by an outage.
    async with jobs_on_memory([stepped_once]) as (jobs, driver):
        outage = Outage(driver, steps=True)
        outage.fail["steps.put"] = 10_000
        enq = await stepped_once.enqueue(Item("r"))
        async with running_worker(jobs, visibility_timeout="60s") as worker:
            await wait_for(lambda: worker.stats().faulted >= 2)
            view = await jobs.show(enq.id)
            assert view.state in ("ready", "running")
            assert view.error_code == ErrorCode.X_DRIVER_UNAVAILABLE
            assert view.last_error is not None
            assert "uncounted" in view.last_error
            assert SECRET not in view.last_error
            outage.fail["steps.put"] = 0
            view = await wait_state(jobs, enq.id, "done")
            stats = worker.stats()
        assert (stats.retried, stats.dead_lettered, stats.failed) == (0, 0, 0)
        assert view.attempts == 1  # every faulted attempt was given back
        assert view.steps[0].executions == 1  # no record landed before the last run
        assert len(ran) == stats.faulted + 1  # the step re-ran once per hand-back
        retries = events_named(caplog, "jobs.step.retry")
        assert retries
        assert all(tj_logging.fields_of(r)["retry_in"] <= RETRY_CAP for r in retries)
        faulted = events_named(caplog, "jobs.attempt.faulted")
        assert len(faulted) == stats.faulted
        for record in faulted:
            fields = tj_logging.fields_of(record)
            assert fields["code"] == ErrorCode.X_DRIVER_UNAVAILABLE
            assert fields["job_id"] == enq.id
            assert SECRET not in tj_logging.JsonFormatter().format(record)
        assert not events_named(caplog, "jobs.attempt.retried")


async def test_a_step_load_that_fails_hands_the_run_back_uncounted_with_its_code(
    autojump_clock: Any,
) -> None:
    async with jobs_on_memory([stepped_once]) as (jobs, driver):
        enq = await stepped_once.enqueue(Item("s"))
        # The claim does not carry step records on this driver when told not to:
        # make the worker load them, and fail that load once.
        real_claim = driver.claim

        async def claim(options: Any) -> Any:
            result = await real_claim(options)
            return attrs.evolve(result, jobs=[attrs.evolve(c, steps=None) for c in result.jobs])

        driver.claim = claim
        outage = Outage(driver, steps=True)
        outage.fail["steps.load"] = 1
        async with running_worker(jobs) as worker:
            view = await wait_state(jobs, enq.id, "done")
            assert worker.stats().faulted == 1
        assert view.attempts == 1
        assert ran == ["s"]


# --------------------------------------------------------------------------- progress


@job(input=Item, idempotency_key=lambda i: i.key, name="wr.progress")
async def reporting(ctx: JobContext[Item]) -> str:
    ctx.progress(1, 2, "half")
    await gate.wait()
    return "ok"


async def test_progress_a_failed_heartbeat_carried_is_carried_again(
    autojump_clock: Any,
) -> None:
    async with jobs_on_memory([reporting]) as (jobs, driver):
        outage = Outage(driver)
        outage.fail["heartbeat"] = 1
        enq = await reporting.enqueue(Item("g"))
        async with running_worker(jobs, visibility_timeout="30s"):
            view = await wait_for(lambda: _progress_of(jobs, enq.id), what="the progress to land")
            assert view.note == "half"
            assert outage.calls["heartbeat"] >= 2
            gate.set()
            await wait_state(jobs, enq.id, "done")


async def _progress_of(jobs: Any, job_id: str) -> Any:
    return (await jobs.show(job_id)).progress


# --------------------------------------------------------------------------- heartbeats


async def test_a_renewal_that_meets_a_short_outage_is_retried_within_its_beat(
    autojump_clock: Any, caplog: Any
) -> None:
    async with jobs_on_memory([gated]) as (jobs, driver):
        outage = Outage(driver)
        enq = await gated.enqueue(Item("h"))
        async with running_worker(jobs, visibility_timeout="30s") as worker:
            await wait_for(lambda: ran == ["h"])
            outage.fail["heartbeat"] = 2
            began = trio.current_time()
            await wait_for(lambda: outage.reached["heartbeat"] >= 1, what="a renewal")
            landed = trio.current_time()
            gate.set()
            await wait_state(jobs, enq.id, "done")
            assert worker.stats().leases_lost == 0
        # The failed tries were retried at once, not at the next beat 10 s later.
        assert landed - began <= worker.heartbeat_interval + 2 * RETRY_CAP
        retries = events_named(caplog, "jobs.heartbeat.retry")
        assert [tj_logging.fields_of(r)["retry"] for r in retries] == [1, 2]
        for record in retries:
            level, catalogued, _meaning = tj_logging.EVENTS["jobs.heartbeat.retry"]
            assert record.levelname.lower() == level
            assert set(tj_logging.fields_of(record)) == set(catalogued)
        assert not events_named(caplog, "jobs.heartbeat.failed")


# --------------------------------------------------------------------------- claims


async def test_a_claim_whose_answer_was_lost_hands_its_rows_back_uncounted(
    autojump_clock: Any, caplog: Any
) -> None:
    # The claim committed, its answer was lost with the connection: the row runs
    # under this worker, unknown to it. Before, it waited for its lease to lapse
    # and the reap counted the attempt: with attempts=1, it died without running.
    async with jobs_on_memory([stepped_once]) as (jobs, driver):
        outage = Outage(driver, steps=False)
        outage.lose["claim"] = 1
        enq = await stepped_once.enqueue(Item("c"))
        async with running_worker(jobs, visibility_timeout="60s") as worker:
            began = trio.current_time()
            view = await wait_state(jobs, enq.id, "done")
            took = trio.current_time() - began
            stats = worker.stats()
        assert view.attempts == 1
        assert took < 60.0  # handed back at once, not after the lease lapsed
        assert (stats.done, stats.dead_lettered, stats.leases_lost) == (1, 0, 0)
        assert ran == ["c"]
        released = events_named(caplog, "jobs.claim.orphans-released")
        assert len(released) == 1
        level, catalogued, _meaning = tj_logging.EVENTS["jobs.claim.orphans-released"]
        assert released[0].levelname.lower() == level
        assert set(tj_logging.fields_of(released[0])) == set(catalogued)
        assert tj_logging.fields_of(released[0])["count"] == 1
