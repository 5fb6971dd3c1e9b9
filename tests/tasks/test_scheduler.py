"""Spec: "Scheduled tasks — task()" — the scheduler on the memory driver (the
process is its fleet): firing at each occurrence, one leader, failover within
one lease ttl, pause and resume fleet-wide, the operator surface, and an idle
scheduler's silence between due instants. On Trio's MockClock."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import trio

from jobs_support import wait_for
from trio_jobs import (
    Actor,
    ErrorCode,
    JobContext,
    JobsError,
    Occurrence,
    TaskView,
    Worker,
    acting_as,
    job,
    memory_driver,
    next_fire,
    open_jobs,
    task,
)
from trio_jobs._scheduler import LEASE_TTL, RENEW_EVERY, Scheduler
from trio_jobs._time import TrioClock
from trio_jobs.drivers.memory import MemoryDriver

FIRED: list[tuple[str, datetime]] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    FIRED.clear()


@task(every="10s", name="tick")
async def tick(ctx: JobContext[Occurrence]) -> None:
    FIRED.append(("tick", ctx.input.at))


@task(every="1h", name="hourly", catch_up="all", queue="reports")
async def hourly(ctx: JobContext[Occurrence]) -> None:
    FIRED.append(("hourly", ctx.input.at))


@task(cron="*/5 * * * *", tz="Europe/Paris", name="paris")
async def paris(ctx: JobContext[Occurrence]) -> None:
    FIRED.append(("paris", ctx.input.at))


async def _until(predicate: Any, timeout: float = 3600.0) -> None:
    await wait_for(predicate, timeout=timeout, step=0.5)


def _instants(name: str) -> list[float]:
    return [at.timestamp() for n, at in FIRED if n == name]


class _Counting(MemoryDriver):
    """A memory driver counting calls to its task store (statements, elsewhere)."""

    def __init__(self) -> None:
        # Noon UTC: none of the tests' daily tasks (04:xx) falls due in the window.
        super().__init__(clock=TrioClock(datetime(2026, 6, 1, 12, tzinfo=UTC).timestamp()))
        self.calls: Counter[str] = Counter()
        store = self.tasks
        assert store is not None
        for method in ("lead", "fire", "release"):
            inner = getattr(store, method)

            def counted(*args: Any, _inner: Any = inner, _name: str = method) -> Any:
                self.calls[_name] += 1
                return _inner(*args)

            setattr(store, method, counted)


class TestFiring:
    async def test_each_occurrence_fires_once_at_its_instant(self, autojump_clock: Any) -> None:
        driver = memory_driver()
        async with open_jobs(driver, jobs=[tick]) as jobs, trio.open_nursery() as nursery:
            armed = driver.now()
            worker = Worker(jobs)
            await nursery.start(worker.run)
            await trio.sleep(61)
            await worker.drain()
        fired = _instants("tick")
        assert fired, "nothing fired"
        assert all(at % 10 == 0 for at in fired)
        assert fired == sorted(set(fired)), "one run per occurrence, in order"
        assert fired[0] > armed
        assert fired[0] - armed <= 10
        assert len(fired) >= 5
        views = [v for v in await _views_after(driver, [tick])]
        assert views[0].last_fire is not None
        assert views[0].last_fire.timestamp() == fired[-1]

    async def test_the_input_is_the_occurrence_in_the_tasks_zone(self, autojump_clock: Any) -> None:
        driver = memory_driver()
        async with open_jobs(driver, jobs=[paris]) as jobs, trio.open_nursery() as nursery:
            worker = Worker(jobs)
            await nursery.start(worker.run)
            await _until(lambda: _instants("paris"))
            page = await jobs.list(name="paris")
            await worker.drain()
        [(_n, at)] = FIRED[:1]
        assert at.tzinfo == ZoneInfo("Europe/Paris")
        assert at.minute % 5 == 0
        assert at.second == 0
        row = page.rows[-1]
        assert row.idempotency_key == "task:paris:" + at.astimezone(UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        assert row.tenant_id is None

    async def test_a_worker_not_serving_the_queue_runs_no_scheduler(
        self, autojump_clock: Any
    ) -> None:
        driver = _Counting()
        async with open_jobs(driver, jobs=[hourly]) as jobs, trio.open_nursery() as nursery:
            worker = Worker(jobs, queues=["default"])
            await nursery.start(worker.run)
            await trio.sleep(30)
            await worker.drain()
        assert driver.calls == Counter()

    async def test_a_driver_without_a_task_store_refuses_to_serve_tasks(
        self, autojump_clock: Any
    ) -> None:
        class NoTasks(MemoryDriver):
            def __init__(self) -> None:
                super().__init__()
                self.tasks = None

        async with open_jobs(NoTasks(), jobs=[tick]) as jobs:
            with pytest.raises(JobsError) as caught:
                await Worker(jobs).run()
        assert caught.value.code == ErrorCode.X_CONFIG_INVALID
        assert "tick" in caught.value.message


class TestLeadership:
    async def test_two_workers_one_leader_each_occurrence_once(self, autojump_clock: Any) -> None:
        driver = memory_driver()
        async with open_jobs(driver, jobs=[tick]) as jobs, trio.open_nursery() as nursery:
            a, b = Worker(jobs, worker_id="a"), Worker(jobs, worker_id="b")
            await nursery.start(a.run)
            await nursery.start(b.run)
            await trio.sleep(120)
            assert driver.tasks is not None
            [row] = await driver.tasks.rows()
            assert row.leader in ("a", "b")
            await a.drain()
            await b.drain()
        fired = _instants("tick")
        assert len(fired) == len(set(fired)) >= 11

    async def test_a_dead_leaders_tasks_are_taken_over_within_one_ttl(
        self, autojump_clock: Any
    ) -> None:
        """A leader that stops renewing (it died: its lease is never released)
        loses the task within one lease ttl; the new leader fires what fell due
        meanwhile by the catch_up rule (``all`` here: each of them)."""
        every = task(every="5s", name="every5", catch_up="all")(_record("every5"))
        driver = memory_driver()
        async with open_jobs(driver, jobs=[every]) as jobs:
            dead = Scheduler(jobs, [every], "dead")
            await dead.lead()  # leads once, then never again: a SIGKILL
            died = trio.current_time()
            async with trio.open_nursery() as nursery:
                worker = Worker(jobs, worker_id="heir")
                await nursery.start(worker.run)
                await _until(lambda: bool(_instants("every5")))
                took_over = trio.current_time() - died
                await trio.sleep(20)
                await worker.drain()
        assert took_over <= LEASE_TTL + 0.5
        fired = sorted(_instants("every5"))  # (the missed ones ran side by side)
        assert len(fired) == len(set(fired)), "one run per occurrence"
        assert [b - a for a, b in itertools.pairwise(fired)] == [5.0] * (len(fired) - 1)
        assert fired[0] - (driver.now() - trio.current_time() + died) <= 5.0, (
            "the first occurrence after the dead leader's arming fired too"
        )

    async def test_a_clean_stop_hands_the_lease_over_at_the_next_renewal(
        self, autojump_clock: Any
    ) -> None:
        driver = memory_driver()
        async with open_jobs(driver, jobs=[tick]) as jobs, trio.open_nursery() as nursery:
            a, b = Worker(jobs, worker_id="a"), Worker(jobs, worker_id="b")
            await nursery.start(a.run)
            await trio.sleep(1)
            await nursery.start(b.run)
            await trio.sleep(1)
            assert driver.tasks is not None
            assert (await driver.tasks.rows())[0].leader == "a"
            await a.drain()
            assert (await driver.tasks.rows())[0].leader is None
            await trio.sleep(RENEW_EVERY + 1)
            assert (await driver.tasks.rows())[0].leader == "b"
            await b.drain()


def _record(name: str) -> Any:
    async def body(ctx: JobContext[Occurrence]) -> None:
        FIRED.append((name, ctx.input.at))

    return body


async def _views_after(driver: MemoryDriver, handles: list[Any]) -> list[TaskView]:
    async with open_jobs(driver, jobs=handles) as jobs:
        return await jobs.tasks()


class TestPauseAndOperate:
    async def test_pause_stops_every_fire_and_resume_catches_up_by_the_rule(
        self, autojump_clock: Any
    ) -> None:
        driver = memory_driver()
        async with open_jobs(driver, jobs=[tick]) as jobs, trio.open_nursery() as nursery:
            worker = Worker(jobs)
            await nursery.start(worker.run)
            await _until(lambda: bool(_instants("tick")))
            await jobs.pause_task("tick")
            await trio.sleep(1)
            before = len(_instants("tick"))
            await trio.sleep(120)
            assert len(_instants("tick")) == before, "a paused task fires nothing"
            [view] = await jobs.tasks()
            assert view.paused
            assert view.next_fire is None
            await jobs.resume_task("tick")
            await trio.sleep(RENEW_EVERY + 1)
            await worker.drain()
        after = _instants("tick")
        # latest: of the ~12 missed occurrences, only the most recent fired.
        assert 1 <= len(after) - before <= 3
        assert after[before] - after[before - 1] > 100

    async def test_tasks_answers_every_declared_task(self, autojump_clock: Any) -> None:
        driver = memory_driver()
        async with open_jobs(driver, jobs=[tick, paris]) as jobs:
            views = await jobs.tasks()
            assert [v.name for v in views] == ["paris", "tick"]
            p = views[0]
            assert (p.schedule, p.tz, p.paused, p.last_fire) == (
                "*/5 * * * *",
                "Europe/Paris",
                False,
                None,
            )
            now = datetime.fromtimestamp(driver.now(), UTC)
            assert p.next_fire == next_fire(paris, now)
            assert views[1].schedule == "every:10"

    async def test_an_operator_without_the_declarations_reads_the_store(
        self, autojump_clock: Any
    ) -> None:
        driver = memory_driver()
        async with open_jobs(driver, jobs=[paris]) as jobs, trio.open_nursery() as nursery:
            worker = Worker(jobs)
            await nursery.start(worker.run)
            await _until(lambda: bool(_instants("paris")))
            await worker.drain()
            operator = type(jobs)(driver, [])
            [view] = await operator.tasks()
            assert view.name == "paris"
            assert view.tz == "Europe/Paris"
            assert view.last_fire == FIRED[0][1]
            await operator.pause_task("paris")
            assert (await operator.tasks())[0].paused

    async def test_an_unknown_name_is_task_not_found(self, autojump_clock: Any) -> None:
        plain = job(idempotency_key=lambda _i: "k", name="plain")(_record("plain"))
        async with open_jobs(memory_driver(), jobs=[tick, plain]) as jobs:
            for call in (jobs.pause_task, jobs.resume_task):
                for name in ("nope", "plain"):
                    with pytest.raises(JobsError) as caught:
                        await call(name)
                    assert caught.value.code == ErrorCode.X_TASK_NOT_FOUND
            with pytest.raises(JobsError) as caught:
                await jobs.pause_task("bad\x00name")
            assert caught.value.code == ErrorCode.X_INVARIANT
            await jobs.pause_task("tick")  # declared, not registered yet
            assert [v.paused for v in await jobs.tasks()] == [True]

    async def test_pausing_spans_every_org(self, autojump_clock: Any) -> None:
        async with open_jobs(memory_driver(), jobs=[tick]) as jobs:
            with acting_as(Actor("bob", org_id="B")), pytest.raises(JobsError) as caught:
                await jobs.pause_task("tick")
            assert caught.value.code == ErrorCode.X_FORBIDDEN


class TestIdle:
    async def test_an_idle_scheduler_issues_no_call_between_renewals(
        self, autojump_clock: Any
    ) -> None:
        """Fifty tasks due once a day: over a minute, six renewals (one call each
        for all fifty) and no fire."""
        daily = [
            task(cron=f"{i} 4 * * *", name=f"daily.{i}")(_record(f"daily.{i}")) for i in range(50)
        ]
        driver = _Counting()
        async with open_jobs(driver, jobs=daily) as jobs, trio.open_nursery() as nursery:
            worker = Worker(jobs)
            await nursery.start(worker.run)
            await trio.sleep(5)
            driver.calls.clear()
            await trio.sleep(60)
            counted = dict(driver.calls)
            await worker.drain()
        assert counted == {"lead": 6}
