"""Metrics (spec: "Observability" → Metrics): the worker reports through a
``WorkerObserver``; ``PrometheusObserver`` turns it into ``jobs_total``,
``job_leases_lost_total``, ``job_duration_seconds``, ``job_worker_in_flight``
and ``job_worker_capacity``; ``/metrics`` adds ``queue_depth`` and
``queue_demand`` read from the facade."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import trio

from jobs_support import jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import JobContext, Retry, Worker, WorkerObserver, job
from trio_jobs.errors import ErrorCode, JobsError

prometheus_client = pytest.importorskip("prometheus_client", reason="metrics need the `web` extra")
from prometheus_client import CollectorRegistry  # noqa: E402

from trio_jobs.web import PrometheusObserver, render_metrics  # noqa: E402


@attrs.frozen
class Item:
    key: str


def sample(registry: CollectorRegistry, metric: str, **labels: str) -> float:
    value = registry.get_sample_value(metric, labels)
    return 0.0 if value is None else value


@job(input=Item, idempotency_key=lambda i: i.key, queue="mail")
async def ok(ctx: JobContext[Item]) -> str:
    await trio.sleep(2)
    return "sent"


@job(input=Item, idempotency_key=lambda i: i.key, queue="mail", retry=Retry(attempts=2))
async def flaky(ctx: JobContext[Item]) -> None:
    raise RuntimeError("always")


async def test_jobs_total_by_outcome_and_the_duration_histogram(autojump_clock: Any) -> None:
    registry = CollectorRegistry()
    async with jobs_on_memory([ok, flaky]) as (jobs, _driver):
        done = [await ok.enqueue(Item(f"k{n}")) for n in range(2)]
        bad = await flaky.enqueue(Item("bad"))
        async with running_worker(jobs, observer=PrometheusObserver(registry)):
            for enq in done:
                await wait_state(jobs, enq.id, "done")
            await wait_state(jobs, bad.id, "dead")
    assert sample(registry, "jobs_total", queue="mail", outcome="done") == 2
    assert sample(registry, "jobs_total", queue="mail", outcome="retried") == 1
    assert sample(registry, "jobs_total", queue="mail", outcome="dead") == 1
    assert sample(registry, "job_duration_seconds_count", queue="mail", name=ok.name) == 2
    assert sample(
        registry, "job_duration_seconds_sum", queue="mail", name=ok.name
    ) == pytest.approx(4.0, abs=0.1)
    assert sample(registry, "job_duration_seconds_count", queue="mail", name=flaky.name) == 2
    # every slot was given back, and the stopped worker's capacity is gone
    assert sample(registry, "job_worker_in_flight") == 0
    assert sample(registry, "job_worker_capacity") == 0


async def test_in_flight_and_capacity_while_running(autojump_clock: Any) -> None:
    registry = CollectorRegistry()
    release = trio.Event()

    @job(input=Item, idempotency_key=lambda i: i.key)
    async def held(ctx: JobContext[Item]) -> None:
        await release.wait()

    async with jobs_on_memory([held]) as (jobs, _driver):
        for n in range(3):
            await held.enqueue(Item(f"k{n}"))
        async with running_worker(jobs, concurrency=5, observer=PrometheusObserver(registry)):
            await wait_for(lambda: sample(registry, "job_worker_in_flight") == 3)
            assert sample(registry, "job_worker_capacity") == 5
            # a second worker in the same process adds up on the same registry
            async with running_worker(jobs, concurrency=2, observer=PrometheusObserver(registry)):
                assert sample(registry, "job_worker_capacity") == 7
            release.set()
            await wait_for(lambda: sample(registry, "job_worker_in_flight") == 0)
    assert sample(registry, "jobs_total", queue="default", outcome="done") == 3


async def test_a_lost_lease_is_one_point_on_job_leases_lost_total(autojump_clock: Any) -> None:
    registry = CollectorRegistry()

    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
    async def holds(ctx: JobContext[Item]) -> None:
        if ctx.attempt == 1:
            await trio.sleep_forever()

    async with jobs_on_memory([holds]) as (jobs, driver):
        real = driver.heartbeat
        failing = [False]

        async def heartbeat(requests: Sequence[Any], visibility_timeout: float) -> list[str]:
            if failing[0]:
                raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "away")
            return await real(requests, visibility_timeout)

        driver.heartbeat = heartbeat  # type: ignore[method-assign]
        enq = await holds.enqueue(Item("a"))
        async with running_worker(
            jobs, visibility_timeout="30s", observer=PrometheusObserver(registry)
        ):
            await trio.sleep(1)
            failing[0] = True
            await wait_for(lambda: sample(registry, "job_leases_lost_total", queue="default"))
            failing[0] = False
            await wait_state(jobs, enq.id, "done")
    assert sample(registry, "job_leases_lost_total", queue="default") == 1
    assert sample(registry, "jobs_total", queue="default", outcome="done") == 1


async def test_a_drained_attempt_is_counted_drained(autojump_clock: Any) -> None:
    registry = CollectorRegistry()

    @job(input=Item, idempotency_key=lambda i: i.key)
    async def long(ctx: JobContext[Item]) -> None:
        await trio.sleep_forever()

    async with jobs_on_memory([long]) as (jobs, _driver):
        enq = await long.enqueue(Item("a"))
        worker = Worker(jobs, observer=PrometheusObserver(registry))
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_state(jobs, enq.id, "running")
            await worker.drain()
    assert sample(registry, "jobs_total", queue="default", outcome="drained") == 1


class Recording(WorkerObserver):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def worker_started(self, worker_id: str, capacity: int) -> None:
        self.calls.append(("started", capacity))

    def worker_stopped(self, worker_id: str, capacity: int) -> None:
        self.calls.append(("stopped", capacity))

    def slot_taken(self, queue: str, name: str) -> None:
        self.calls.append(("taken", queue))

    def slot_freed(self, queue: str, name: str, seconds: float | None) -> None:
        self.calls.append(("freed", queue, seconds is not None))

    def attempt_ended(self, queue: str, name: str, outcome: str) -> None:
        self.calls.append(("ended", queue, outcome))


async def test_a_plain_observer_sees_the_whole_lifecycle_and_no_payload(
    autojump_clock: Any,
) -> None:
    seen = Recording()
    async with jobs_on_memory([ok]) as (jobs, _driver):
        enq = await ok.enqueue(Item("secret-key-value"))
        async with running_worker(jobs, observer=seen, concurrency=2):
            await wait_state(jobs, enq.id, "done")
    assert seen.calls == [
        ("started", 2),
        ("taken", "mail"),
        ("ended", "mail", "done"),
        ("freed", "mail", True),
        ("stopped", 2),
    ]
    assert "secret-key-value" not in repr(seen.calls)


async def test_a_failing_observer_never_fails_a_job(autojump_clock: Any, caplog: Any) -> None:
    class Broken(WorkerObserver):
        def attempt_ended(self, queue: str, name: str, outcome: str) -> None:
            raise RuntimeError("metrics backend down")

    async with jobs_on_memory([ok]) as (jobs, _driver):
        first = await ok.enqueue(Item("a"))
        second = await ok.enqueue(Item("b"))
        async with running_worker(jobs, observer=Broken()):
            await wait_state(jobs, first.id, "done")
            await wait_state(jobs, second.id, "done")
    reported = [r for r in caplog.records if getattr(r, "event", None) == "jobs.observer.failed"]
    assert len(reported) == 1  # once per method, not once per call
    assert reported[0].method == "attempt_ended"  # type: ignore[attr-defined]


def test_an_observer_that_is_not_one_is_refused() -> None:
    from trio_jobs import Jobs, memory_driver

    with pytest.raises(JobsError) as caught:
        Worker(Jobs(memory_driver(), [ok]), observer=object())  # type: ignore[arg-type]
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


async def test_queue_depth_and_demand_are_read_from_the_facade_at_scrape_time(
    autojump_clock: Any,
) -> None:
    async with jobs_on_memory([ok]) as (jobs, _driver):
        for n in range(3):
            await ok.enqueue(Item(f"now{n}"))
        await ok.enqueue(Item("later"), delay="1h")
        await jobs.pause_queue("mail")
        text = (await render_metrics(jobs, CollectorRegistry())).decode()
        await jobs.resume_queue("mail")
        again = (await render_metrics(jobs, CollectorRegistry())).decode()
    assert 'queue_depth{queue="mail"} 4.0' in text
    assert 'queue_demand{queue="mail"} 3.0' in text  # ready + running: the delayed one waits
    assert 'queue_jobs{queue="mail",state="delayed"} 1.0' in text
    assert 'queue_paused{queue="mail"} 1.0' in text
    assert 'queue_paused{queue="mail"} 0.0' in again


def test_the_worker_does_not_import_prometheus_client() -> None:
    code = (
        "import sys, trio_jobs; "
        "from trio_jobs import Worker; "
        "print('prometheus_client' in sys.modules, 'starlette' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
