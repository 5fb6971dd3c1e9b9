"""The task store's rules (``JobDriver.tasks``), one suite for every driver.

Mixed into each driver's conformance class (memory, PostgreSQL, Redis), which
provides the ``target`` fixture: a fresh, opened driver on a manual clock."""

from __future__ import annotations

from typing import Any

import pytest

from trio_jobs.drivers import TaskFire, TaskSpec
from trio_jobs.testing.conformance import Target, request

TTL = 30.0


def spec(name: str = "t.nightly", schedule: str = "every:60", queue: str = "default") -> TaskSpec:
    return TaskSpec(name=name, schedule=schedule, tz="UTC", catch_up="latest", queue=queue)


def _store(target: Target) -> Any:
    store = target.driver.tasks
    if store is None:
        pytest.skip(f"the {target.driver.name} driver declares no task store")
    return store


async def _claimable(target: Target, queue: str = "default") -> list[Any]:
    from trio_jobs.drivers import ClaimOptions

    got = await target.driver.claim(
        ClaimOptions(worker_id="reader", queues={queue: 100}, visibility_timeout=30.0)
    )
    return list(got.jobs)


def _occurrence(name: str, at: float, queue: str = "default") -> Any:
    return request(name, f"task:{name}:{at}", queue=queue, payload={"at": at})


class TaskStoreConformance:
    async def test_a_new_task_is_armed_at_the_store_now_and_led_by_the_first(
        self, target: Target
    ) -> None:
        store = _store(target)
        now = target.driver.now()
        [lead] = await store.lead("a", [spec()], TTL)
        assert lead.leader == "a"
        assert lead.watermark == pytest.approx(now, abs=2.0)
        assert lead.last_fire is None
        assert lead.paused is False
        assert lead.lease_expires_at == pytest.approx(lead.watermark + TTL, abs=1.0)
        [other] = await store.lead("b", [spec()], TTL)
        assert other.leader == "a", "a live lease is not taken"
        assert other.watermark == lead.watermark

    async def test_a_renewal_extends_the_lease_and_a_lapsed_one_is_taken_over(
        self, target: Target
    ) -> None:
        store = _store(target)
        [first] = await store.lead("a", [spec()], TTL)
        await target.advance(20)
        [renewed] = await store.lead("a", [spec()], TTL)
        assert renewed.leader == "a"
        assert renewed.lease_expires_at is not None
        assert first.lease_expires_at is not None
        assert renewed.lease_expires_at > first.lease_expires_at
        await target.advance(20)
        [still] = await store.lead("b", [spec()], TTL)
        assert still.leader == "a", "renewed 20 s ago with a 30 s ttl: still a's"
        await target.advance(11)
        [taken] = await store.lead("b", [spec()], TTL)
        assert taken.leader == "b"
        assert taken.watermark == first.watermark, "the watermark survives a takeover"

    async def test_a_fire_enqueues_its_rows_and_moves_the_watermark_together(
        self, target: Target
    ) -> None:
        store = _store(target)
        [lead] = await store.lead("a", [spec()], TTL)
        at = lead.watermark + 60
        fire = TaskFire("t.nightly", lead.watermark, at, [_occurrence("t.nightly", at)], at)
        assert await store.fire("a", [fire]) == ["t.nightly"]
        jobs = await _claimable(target)
        assert [j.idempotency_key for j in jobs] == [f"task:t.nightly:{at}"]
        [row] = await store.rows()
        assert (row.name, row.watermark, row.last_fire) == ("t.nightly", at, at)
        assert row.schedule == "every:60"
        assert row.tz == "UTC"
        assert row.catch_up == "latest"
        assert row.fired_at is not None
        [again] = await store.lead("a", [spec()], TTL)
        assert (again.watermark, again.last_fire) == (at, at)

    async def test_a_fire_is_fenced_on_the_watermark_the_lease_and_the_pause(
        self, target: Target
    ) -> None:
        store = _store(target)
        [lead] = await store.lead("a", [spec()], TTL)
        w = lead.watermark

        def fire(watermark: float, at: float) -> TaskFire:
            return TaskFire("t.nightly", watermark, at, [_occurrence("t.nightly", at)], at)

        assert await store.fire("a", [fire(w - 1, w + 60)]) == [], "a stale watermark"
        assert await store.fire("b", [fire(w, w + 60)]) == [], "not the leader"
        await store.pause("t.nightly")
        assert await store.fire("a", [fire(w, w + 60)]) == [], "paused"
        assert await store.paused() == ["t.nightly"]
        [paused] = await store.lead("a", [spec()], TTL)
        assert paused.paused is True
        await store.resume("t.nightly")
        assert await store.paused() == []
        await target.advance(TTL + 1)
        assert await store.fire("a", [fire(w, w + 60)]) == [], "the lease lapsed"
        assert await _claimable(target) == [], "no fence that failed enqueued anything"
        [row] = await store.rows()
        assert row.watermark == w
        assert row.last_fire is None
        await store.lead("a", [spec()], TTL)
        assert await store.fire("a", [fire(w, w + 60)]) == ["t.nightly"]
        assert len(await _claimable(target)) == 1

    async def test_a_skip_moves_the_watermark_without_a_fire(self, target: Target) -> None:
        store = _store(target)
        [lead] = await store.lead("a", [spec()], TTL)
        through = lead.watermark + 600
        assert await store.fire("a", [TaskFire("t.nightly", lead.watermark, through)]) == [
            "t.nightly"
        ]
        [row] = await store.rows()
        assert (row.watermark, row.last_fire, row.fired_at) == (through, None, None)
        assert await _claimable(target) == []

    async def test_a_fire_of_a_live_occurrence_dedupes(self, target: Target) -> None:
        store = _store(target)
        [lead] = await store.lead("a", [spec()], TTL)
        at = lead.watermark + 60
        held = _occurrence("t.nightly", at)
        await target.driver.enqueue_many([held])
        twin = _occurrence("t.nightly", at)
        assert await store.fire("a", [TaskFire("t.nightly", lead.watermark, at, [twin], at)]) == [
            "t.nightly"
        ]
        jobs = await _claimable(target)
        assert [j.id for j in jobs] == [held.id], "one occurrence is one run"

    async def test_one_call_fires_many_tasks_each_fenced_on_its_own(self, target: Target) -> None:
        store = _store(target)
        a, b = spec("t.a"), spec("t.b")
        leads = await store.lead("x", [a, b], TTL)
        assert [lead.name for lead in leads] == ["t.a", "t.b"]
        w = leads[0].watermark
        fires = [
            TaskFire("t.a", w, w + 60, [_occurrence("t.a", w + 60)], w + 60),
            TaskFire("t.b", w - 5, w + 60, [_occurrence("t.b", w + 60)], w + 60),
        ]
        assert await store.fire("x", fires) == ["t.a"]
        assert [j.name for j in await _claimable(target)] == ["t.a"]

    async def test_release_lets_another_lead_at_once(self, target: Target) -> None:
        store = _store(target)
        await store.lead("a", [spec()], TTL)
        await store.release("a", ["t.nightly"])
        [lead] = await store.lead("b", [spec()], TTL)
        assert lead.leader == "b"
        await store.release("a", ["t.nightly"])  # not a's any more: nothing moves
        [still] = await store.lead("c", [spec()], TTL)
        assert still.leader == "b"

    async def test_the_leaders_declaration_replaces_the_stored_one(self, target: Target) -> None:
        store = _store(target)
        await store.lead("a", [spec()], TTL)
        await store.lead("b", [spec(schedule="0 3 * * *")], TTL)  # not the leader
        [row] = await store.rows()
        assert row.schedule == "every:60"
        await store.lead("a", [spec(schedule="0 3 * * *", queue="reports")], TTL)
        [row] = await store.rows()
        assert (row.schedule, row.queue) == ("0 3 * * *", "reports")

    async def test_an_unregistered_name_can_be_paused(self, target: Target) -> None:
        store = _store(target)
        await store.pause("t.later")
        await store.pause("t.later")
        assert await store.paused() == ["t.later"]
        assert await store.rows() == []
