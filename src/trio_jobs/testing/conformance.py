"""The driver conformance suite: one set of tests every driver must pass unchanged.

Subclass :class:`DriverConformance` in a test module and provide a ``target``
fixture that yields a :class:`Target` over a fresh, opened driver::

    class TestMemoryConformance(DriverConformance):
        @pytest.fixture
        async def target(self):
            clock = ManualClock()
            driver = memory_driver(clock=clock)
            await driver.open()
            yield Target(driver, clock.advance)
            await driver.close()

``advance(seconds)`` moves the driver's clock: the memory driver and the
PostgreSQL driver both take a test-only ``clock=`` (an object with ``now()``),
which replaces the database's clock in every due-time and lease decision. Capabilities a driver declares missing
(``leases``/``introspect`` is ``None``) skip their tests with the reason.
Needs pytest-trio with ``trio_mode = true``.
"""

from __future__ import annotations

import inspect
import itertools
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio

from ..drivers._protocol import (
    CANCELLED_LINE,
    LAPSED_LINE,
    MAX_ATTEMPT_ERROR,
    MAX_ATTEMPT_LOG,
    MAX_BULK_ROWS,
    AckOptions,
    BulkFilter,
    ClaimOptions,
    EnqueueRequest,
    Fence,
    HeartbeatRequest,
    HeartbeatStatus,
    JobDriver,
    ListFilter,
    NackOptions,
    Progress,
    StepMark,
    StepRecord,
    WorkerInfo,
)
from ..errors import ErrorCode, JobsError
from ._conformance_backfills import BackfillConformance
from ._conformance_rate import RateLimitConformance

__all__ = ["DriverConformance", "ManualClock", "Target", "request"]

VT = 30.0


class ManualClock:
    """A clock that only moves when told (for the memory driver's conformance run)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.value = start

    def now(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


@attrs.define
class Target:
    """A driver under test and a way to move its clock."""

    driver: JobDriver
    advance_fn: Callable[[float], Awaitable[None] | None]

    async def advance(self, seconds: float) -> None:
        result = self.advance_fn(seconds)
        if inspect.isawaitable(result):
            await result


def request(
    name: str = "conf.job",
    key: str | None = None,
    *,
    queue: str = "default",
    tenant_id: str | None = None,
    payload: Any = None,
    max_attempts: int = 3,
    priority: int = 0,
    delay: float | None = None,
    run_at: float | None = None,
    concurrency_key: str | None = None,
    id: str | None = None,
) -> EnqueueRequest:
    """An :class:`EnqueueRequest` with fresh ids (a test helper)."""
    return EnqueueRequest(
        id=id or str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        name=name,
        queue=queue,
        payload=payload if payload is not None else {"n": 1},
        idempotency_key=key or str(uuid.uuid4()),
        max_attempts=max_attempts,
        tenant_id=tenant_id,
        concurrency_key=concurrency_key,
        priority=priority,
        delay=delay,
        run_at=run_at,
    )


def _claim(worker: str = "w1", n: int = 10, queue: str = "default", **kw: Any) -> ClaimOptions:
    return ClaimOptions(worker_id=worker, queues={queue: n}, visibility_timeout=VT, **kw)


async def _one(driver: JobDriver, worker: str = "w1", queue: str = "default") -> Any:
    got = await driver.claim(_claim(worker, 1, queue))
    assert len(got.jobs) == 1, f"expected one claimable job, got {len(got.jobs)}"
    return got.jobs[0]


def _intro(driver: JobDriver) -> Any:
    if driver.introspect is None:
        pytest.skip(f"the {driver.name} driver declares no introspection")
    return driver.introspect


def _leases(driver: JobDriver) -> Any:
    if driver.leases is None:
        pytest.skip(f"the {driver.name} driver declares no lease store")
    return driver.leases


def _waking(driver: JobDriver) -> Any:
    leases = _leases(driver)
    if not leases.wakes_waiters:
        pytest.skip(f"the {driver.name} driver's lease store does not wake waiting runs")
    return leases


def _busy(job: Any, key: str) -> NackOptions:
    """The worker's hand-back of a run that met a busy key: it waits on the key,
    bounded far out (only a release should make it due)."""
    return NackOptions(fence=job.fence, state="ready", counted=False, delay=VT * 10, busy_key=key)


class DriverConformance(BackfillConformance, RateLimitConformance):
    """Every rule of the driver protocol. Subclass it and provide ``target``."""

    # ------------------------------------------------------------------ capabilities

    async def test_declared_capabilities_are_present_with_their_types(self, target: Target) -> None:
        """Every capability the protocol declares is a plain attribute (the worker
        reads it, never probes it): ``closed``, ``event_poll_default``, the lease
        store's ``wakes_waiters`` and the wake's ``live``."""
        driver = target.driver
        assert isinstance(driver.name, str)
        assert driver.name
        assert type(driver.closed) is bool
        assert driver.closed is False  # the target is open
        assert isinstance(driver.event_poll_default, int | float)
        assert not isinstance(driver.event_poll_default, bool)
        assert 0 < driver.event_poll_default < math.inf
        if driver.leases is not None:
            assert type(driver.leases.wakes_waiters) is bool
        if driver.wake is not None:
            assert type(driver.wake.live) is bool

    # ------------------------------------------------------------------ enqueue

    async def test_enqueue_answers_in_order_with_own_ids(self, target: Target) -> None:
        reqs = [request(key=f"k{i}") for i in range(5)]
        out = await target.driver.enqueue_many(reqs)
        assert [r.id for r in out] == [r.id for r in reqs]
        assert [r.run_id for r in out] == [r.run_id for r in reqs]
        assert not any(r.deduped for r in out)

    async def test_live_key_dedupes_and_first_payload_wins(self, target: Target) -> None:
        first = request(key="same", payload={"v": 1})
        second = request(key="same", payload={"v": 2})
        a = (await target.driver.enqueue_many([first]))[0]
        b = (await target.driver.enqueue_many([second]))[0]
        assert b.deduped
        assert (b.id, b.run_id) == (a.id, a.run_id)
        job = await _one(target.driver)
        assert job.payload == {"v": 1}

    async def test_dedupe_is_scoped_by_name_and_tenant(self, target: Target) -> None:
        out = await target.driver.enqueue_many(
            [
                request("a", "k", tenant_id="t1"),
                request("a", "k", tenant_id="t2"),
                request("b", "k", tenant_id="t1"),
                request("a", "k", tenant_id=None),
                request("a", "k", tenant_id="t1"),
                request("a", "k", tenant_id=None),
            ]
        )
        assert [r.deduped for r in out] == [False, False, False, False, True, True]
        assert out[4].id == out[0].id
        assert out[5].id == out[3].id

    async def test_two_inputs_sharing_a_key_in_one_batch_are_one_job(self, target: Target) -> None:
        out = await target.driver.enqueue_many([request(key="x"), request(key="x")])
        assert [r.deduped for r in out] == [False, True]
        assert out[0].id == out[1].id
        stats = await target.driver.stats()
        assert sum(s.ready for s in stats) == 1

    async def test_republish_under_the_staged_id_adds_no_row(self, target: Target) -> None:
        req = request(key="once")
        await target.driver.enqueue_many([req])
        job = await _one(target.driver)
        assert await target.driver.ack(job.id, AckOptions(fence=job.fence))
        again = await target.driver.enqueue_many([req])
        assert again[0].deduped
        assert again[0].id == req.id
        stats = await target.driver.stats()
        assert sum(s.done for s in stats) == 1
        assert sum(s.ready for s in stats) == 0

    async def test_terminal_row_frees_its_key(self, target: Target) -> None:
        first = (await target.driver.enqueue_many([request(key="k")]))[0]
        job = await _one(target.driver)
        assert await target.driver.ack(job.id, AckOptions(fence=job.fence, result={"ok": 1}))
        second = (await target.driver.enqueue_many([request(key="k")]))[0]
        assert not second.deduped
        assert second.id != first.id

    async def test_delay_and_run_at_make_a_row_wait(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="later", delay=60.0)])
        assert not (await d.claim(_claim())).jobs
        stats = await d.stats()
        assert sum(s.delayed for s in stats) == 1
        await target.advance(61.0)
        assert len((await d.claim(_claim())).jobs) == 1

    async def test_a_claim_that_says_when_the_next_row_falls_due_is_never_late(
        self, target: Target
    ) -> None:
        d = target.driver
        first = await d.claim(_claim())
        if first.next_due is None:
            pytest.skip(f"the {d.name} driver's claim does not say when the next row falls due")
        assert first.next_due == math.inf  # nothing waits, nothing runs
        await d.enqueue_many(
            [request(key="later", delay=60.0), request(key="elsewhere", queue="p")]
        )
        before = d.now()
        got = await d.claim(_claim())
        assert got.jobs == []
        assert got.next_due is not None
        assert got.next_due <= before + 60.0 + 1e-6  # the delayed row: never late
        await d.enqueue_many([request(key="now")])
        running = await _one(d)
        nd = (await d.claim(_claim())).next_due
        assert nd is not None
        # the running row's lease lapses first: its reap re-offers it
        assert nd <= running.lease_expires_at + 1e-6
        assert await d.ack(running.id, AckOptions(fence=running.fence))
        await target.advance(61.0)
        [late] = (await d.claim(_claim())).jobs
        assert await d.ack(late.id, AckOptions(fence=late.fence))
        assert (await d.claim(_claim())).next_due == math.inf  # settled: nothing to wait for

    async def test_thousand_row_batch(self, target: Target) -> None:
        reqs = [request(key=f"bulk{i}") for i in range(1000)]
        out = await target.driver.enqueue_many(reqs)
        assert len(out) == 1000
        assert not any(r.deduped for r in out)
        stats = await target.driver.stats()
        assert sum(s.ready for s in stats) == 1000

    # ------------------------------------------------------------------ claim

    async def test_claim_takes_due_rows_and_counts_the_attempt(self, target: Target) -> None:
        await target.driver.enqueue_many([request(key="a")])
        job = await _one(target.driver)
        assert job.attempt == 1
        assert job.fence.worker_id == "w1"
        assert not (await target.driver.claim(_claim("w2"))).jobs

    async def test_claim_respects_per_queue_limits_and_pauses(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key=f"a{i}", queue="qa") for i in range(3)])
        await d.enqueue_many([request(key=f"b{i}", queue="qb") for i in range(3)])
        got = await d.claim(ClaimOptions("w1", {"qa": 2, "qb": 1}, VT))
        queues = sorted(j.queue for j in got.jobs)
        assert queues == ["qa", "qa", "qb"]
        if d.introspect is not None:
            await d.introspect.pause_queue("qb")
            got = await d.claim(ClaimOptions("w1", {"qa": 5, "qb": 5}, VT))
            assert [j.queue for j in got.jobs] == ["qa"]
            await d.introspect.resume_queue("qb")
            got = await d.claim(ClaimOptions("w1", {"qa": 5, "qb": 5}, VT))
            assert [j.queue for j in got.jobs] == ["qb", "qb"]

    async def test_lower_priority_runs_first(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="p5", priority=5, payload={"p": 5})])
        await d.enqueue_many([request(key="p-1", priority=-1, payload={"p": -1})])
        await d.enqueue_many([request(key="p0", priority=0, payload={"p": 0})])
        got = await d.claim(_claim(n=3))
        assert [j.payload["p"] for j in got.jobs] == [-1, 0, 5]

    async def test_fences_are_unique_per_claim(self, target: Target) -> None:
        await target.driver.enqueue_many([request(key=f"f{i}") for i in range(4)])
        got = await target.driver.claim(_claim(n=4))
        assert len({j.fence for j in got.jobs}) == 4

    async def test_a_lapsed_lease_is_reoffered_and_fences_the_old_claimer(
        self, target: Target
    ) -> None:
        d = target.driver
        await d.enqueue_many([request(key="lapse")])
        old = await _one(d, "w1")
        await target.advance(VT + 1)
        new = await _one(d, "w2")
        assert new.id == old.id
        assert new.attempt == 2
        assert new.lapsed
        assert new.fence != old.fence
        assert not await d.ack(old.id, AckOptions(fence=old.fence))
        assert not await d.nack(old.id, NackOptions(fence=old.fence, state="ready"))
        assert await d.heartbeat([HeartbeatRequest(old.id, old.fence)], VT) == [
            HeartbeatStatus.LOST
        ]
        assert not await d.steps.put(old.id, old.fence, StepRecord("s", "completed", 1, 1))
        assert await d.ack(new.id, AckOptions(fence=new.fence))

    async def test_a_lapse_on_the_final_attempt_is_buried_by_the_claim(
        self, target: Target
    ) -> None:
        d = target.driver
        await d.enqueue_many(
            [request("dl", key="a", max_attempts=1), request("drop", key="b", max_attempts=1)]
        )
        got = await d.claim(_claim(n=2))
        assert len(got.jobs) == 2
        await target.advance(VT + 1)
        result = await d.claim(_claim("w2", drop_names=frozenset({"drop"})))
        assert not result.jobs
        states = {e.name: e.state for e in result.exhausted}
        assert states == {"dl": "dead", "drop": "failed"}
        for e in result.exhausted:
            assert "lease" in e.last_error.lower()
        stats = await d.stats()
        assert sum(s.dead for s in stats) == 1
        assert sum(s.failed for s in stats) == 1
        # the key is free again
        assert not (await d.enqueue_many([request("dl", key="a")]))[0].deduped

    async def test_an_expired_lease_cannot_settle_even_before_a_reclaim(
        self, target: Target
    ) -> None:
        d = target.driver
        await d.enqueue_many([request(key="x")])
        job = await _one(d)
        await target.advance(VT + 1)
        assert not await d.ack(job.id, AckOptions(fence=job.fence))

    # ------------------------------------------------------------------ settle

    async def test_ack_stores_the_result_and_moves_counters(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request("named", key="x")])
        job = await _one(d)
        assert await d.ack(
            job.id,
            AckOptions(
                fence=job.fence, result={"r": [1, 2]}, duration=0.5, progress=Progress(3, 3, "done")
            ),
        )
        assert not await d.ack(job.id, AckOptions(fence=job.fence))  # no double settle
        intro = d.introspect
        if intro is not None:
            view = await intro.show(job.id)
            assert view.state == "done"
            assert view.result == {"r": [1, 2]}
            assert view.progress == Progress(3, 3, "done")
            rows = await intro.counters("named", 0.0)
            assert sum(r.done for r in rows) == 1

    async def test_nack_counted_and_uncounted(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="x")])
        job = await _one(d)
        assert await d.nack(job.id, NackOptions(fence=job.fence, state="ready", counted=False))
        job2 = await _one(d)
        assert job2.attempt == 1  # the hand-back gave the attempt back
        assert await d.nack(
            job2.id,
            NackOptions(
                fence=job2.fence,
                state="ready",
                counted=True,
                delay=10.0,
                error_code="X_APP",
                last_error="X_APP: boom",
            ),
        )
        assert not (await d.claim(_claim())).jobs
        await target.advance(11.0)
        job3 = await _one(d)
        assert job3.attempt == 2
        intro = d.introspect
        if intro is not None:
            view = await intro.show(job3.id)
            assert view.error_code == "X_APP"
            assert view.attempts == 2

    async def test_nack_to_dead_and_failed(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="a"), request(key="b")])
        a, b = (await d.claim(_claim(n=2))).jobs
        assert await d.nack(
            a.id, NackOptions(fence=a.fence, state="dead", error_code="X_E", last_error="X_E: no")
        )
        assert await d.nack(b.id, NackOptions(fence=b.fence, state="failed"))
        stats = await d.stats()
        assert sum(s.dead for s in stats) == 1
        assert sum(s.failed for s in stats) == 1
        assert not (await d.enqueue_many([request(key="a")]))[0].deduped

    async def test_nack_delayed_and_suspended(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="a"), request(key="b")])
        a, b = (await d.claim(_claim(n=2))).jobs
        now = d.now()
        assert await d.nack(
            a.id, NackOptions(fence=a.fence, state="delayed", counted=False, run_at=now + 100)
        )
        assert await d.nack(
            b.id,
            NackOptions(
                fence=b.fence,
                state="suspended",
                counted=False,
                run_at=now + 100,
                waiting_event="evt",
            ),
        )
        stats = await d.stats()
        assert sum(s.delayed for s in stats) == 1
        assert sum(s.suspended for s in stats) == 1
        assert not (await d.claim(_claim())).jobs
        await d.events.publish("evt", {"x": 1})
        woken = (await d.claim(_claim())).jobs
        assert [j.id for j in woken] == [b.id]

    async def test_nack_raises_max_attempts(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="a", max_attempts=1)])
        a = await _one(d)
        assert await d.nack(
            a.id, NackOptions(fence=a.fence, state="ready", counted=True, max_attempts=3)
        )
        again = await _one(d)
        assert again.max_attempts == 3

    # ------------------------------------------------------------------ heartbeat

    async def test_heartbeat_extends_the_lease(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="hb")])
        job = await _one(d)
        await target.advance(VT * 0.6)
        assert await d.heartbeat([HeartbeatRequest(job.id, job.fence, Progress(1, 2))], VT) == [
            HeartbeatStatus.OK
        ]
        await target.advance(VT * 0.6)
        assert not (await d.claim(_claim("w2"))).jobs
        assert await d.ack(job.id, AckOptions(fence=job.fence))

    async def test_heartbeat_reports_cancelled(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        await d.enqueue_many([request(key="c")])
        job = await _one(d)
        await intro.cancel(job.id, "operator")
        assert await d.heartbeat([HeartbeatRequest(job.id, job.fence)], VT) == [
            HeartbeatStatus.CANCELLED
        ]
        assert not await d.ack(job.id, AckOptions(fence=job.fence))

    async def test_release_orphans_hands_back_only_the_claims_a_worker_does_not_hold(
        self, target: Target
    ) -> None:
        """A claim whose answer was lost left rows running under the worker: they
        go back uncounted, due now, their slots released; the claims it holds,
        other workers' rows and lapsed leases are left alone."""
        d = target.driver
        await d.enqueue_many(
            [request(key=k, max_attempts=1) for k in ("held", "lost1", "lost2", "other")]
        )
        held = await _one(d, "w1")
        lost = (await d.claim(_claim("w1", 2))).jobs  # "its answer never came"
        other = await _one(d, "w2")
        assert len(lost) == 2
        leases = d.leases
        if leases is not None:
            grant = await leases.acquire("orph", 1, lost[0].id, lost[0].fence, VT)
            assert grant.slot == 0
        released = await d.release_orphans("w1", frozenset({held.fence.claim}))
        assert sorted(released) == sorted(j.id for j in lost)
        # Due at once, attempt given back: a claim takes them on attempt 1 again.
        again = (await d.claim(_claim("w3", 10))).jobs
        assert sorted(j.id for j in again) == sorted(j.id for j in lost)
        assert all(j.attempt == 1 for j in again)
        if leases is not None:  # the orphan's slot was released
            grant = await leases.acquire("orph", 1, again[0].id, again[0].fence, VT)
            assert grant.slot == 0
        # The claim it holds and the other worker's row are untouched.
        assert await d.ack(held.id, AckOptions(fence=held.fence))
        assert await d.ack(other.id, AckOptions(fence=other.fence))
        # The released claims are not the worker's any more.
        assert not await d.ack(lost[0].id, AckOptions(fence=lost[0].fence))
        # Nothing left to release.
        assert await d.release_orphans("w1", frozenset()) == []
        intro = d.introspect
        if intro is not None:
            await d.ack(again[0].id, AckOptions(fence=again[0].fence))
            await d.nack(again[1].id, NackOptions(fence=again[1].fence, state="dead"))
            view = await intro.show(again[1].id)
            assert view.attempts == 1

    # ------------------------------------------------------------------ the attempt log

    async def test_the_attempt_log_records_each_claim_and_how_it_ended(
        self, target: Target
    ) -> None:
        """The claim opens an entry, a heartbeat writes the step in progress, the
        settle closes it with the outcome and the error's code and first line."""
        d = target.driver
        await d.enqueue_many([request(key="log", max_attempts=3)])
        t0 = d.now()
        job = await _one(d, "w1")
        [entry] = await d.attempt_log(job.id)
        assert (entry.attempt, entry.worker_id, entry.outcome, entry.ended_at) == (
            1,
            "w1",
            None,
            None,
        )
        assert entry.started_at == pytest.approx(t0, abs=1e-3)
        await target.advance(2.0)
        mark = StepMark("charge", d.now())
        beat = HeartbeatRequest(job.id, job.fence, step=mark)
        assert await d.heartbeat([beat], VT) == [HeartbeatStatus.OK]
        [entry] = await d.attempt_log(job.id)
        assert entry.step == "charge"
        assert entry.step_started_at == pytest.approx(mark.started_at, abs=1e-3)
        await target.advance(1.0)
        message = "X_BOOM: the card was declined\nTraceback (most recent call last):\n  ..."
        assert await d.nack(
            job.id,
            NackOptions(
                fence=job.fence,
                state="ready",
                counted=True,
                error_code="X_BOOM",
                last_error=message,
            ),
        )
        [entry] = await d.attempt_log(job.id)
        assert (entry.outcome, entry.error_code, entry.error) == (
            "retried",
            "X_BOOM",
            "X_BOOM: the card was declined",
        )
        assert entry.ended_at == pytest.approx(t0 + 3.0, abs=1e-3)
        # An uncounted hand-back (a drain), the same attempt again, then done.
        second = await _one(d, "w2")
        assert await d.heartbeat([HeartbeatRequest(second.id, second.fence)], VT) == ["ok"]
        assert await d.nack(
            second.id, NackOptions(fence=second.fence, state="ready", counted=False)
        )
        third = await _one(d, "w3")
        await target.advance(1.0)
        assert await d.ack(third.id, AckOptions(fence=third.fence))
        log = await d.attempt_log(job.id)
        assert [(e.attempt, e.worker_id, e.outcome, e.error_code) for e in log] == [
            (1, "w1", "retried", "X_BOOM"),
            (2, "w2", "handed-back", None),
            (2, "w3", "done", None),
        ]
        assert log[1].step is None  # its heartbeat said: between steps
        for earlier, later in itertools.pairwise(log):
            assert earlier.ended_at is not None
            assert earlier.started_at <= earlier.ended_at <= later.started_at
        assert await d.attempt_log(str(uuid.uuid4())) == []
        intro = d.introspect
        if intro is not None:
            assert list((await intro.show(job.id)).attempt_log) == log

    async def test_the_attempt_log_records_lapses_and_orphans_and_keeps_the_newest(
        self, target: Target
    ) -> None:
        d = target.driver
        await d.enqueue_many([request(key="long", max_attempts=50)])
        first = await _one(d, "w1")
        await target.advance(VT + 1)
        second = await _one(d, "w2")  # the reap closes the lapsed claim's entry
        lapsed, current = await d.attempt_log(first.id)
        assert (lapsed.outcome, lapsed.error_code, lapsed.error) == (
            "lapsed",
            ErrorCode.X_JOB_LEASE_LOST,
            LAPSED_LINE,
        )
        assert (current.attempt, current.worker_id, current.outcome) == (2, "w2", None)
        assert await d.release_orphans("w2", frozenset()) == [second.id]
        orphaned = (await d.attempt_log(first.id))[-1]
        assert (orphaned.outcome, orphaned.error_code) == ("handed-back", "X_DRIVER_UNAVAILABLE")
        assert orphaned.error is not None
        assert len(orphaned.error) <= MAX_ATTEMPT_ERROR
        for n in range(MAX_ATTEMPT_LOG + 3):
            job = await _one(d, f"w{n}")
            assert await d.nack(job.id, NackOptions(fence=job.fence, state="ready", counted=False))
        log = await d.attempt_log(first.id)
        assert len(log) == MAX_ATTEMPT_LOG
        assert log[-1].worker_id == f"w{MAX_ATTEMPT_LOG + 2}"
        assert log[0].worker_id == "w3"  # the oldest went first
        # A lapse on the final attempt: buried by the claim, its entry closed.
        await d.enqueue_many([request(key="last", max_attempts=1, queue="q.last")])
        last = await _one(d, "w1", "q.last")
        await target.advance(VT + 1)
        got = await d.claim(_claim("w9", queue="q.last"))
        assert [x.id for x in got.exhausted] == [last.id]
        [entry] = await d.attempt_log(last.id)
        assert (entry.outcome, entry.error_code) == ("lapsed", ErrorCode.X_JOB_LEASE_LOST)

    async def test_a_done_attempt_stays_closed_when_its_job_is_requeued(
        self, target: Target
    ) -> None:
        """The ack's entry reads as done, ended at the settle, before and after a
        requeue, and the requeued run's claim opens the next entry beside it (a
        driver may close the entry lazily: the PostgreSQL ack leaves it to its
        readers, and its requeue closes it for good)."""
        d = target.driver
        intro = _intro(d)
        await d.enqueue_many([request(key="again")])
        job = await _one(d, "w1")
        await target.advance(1.0)
        settled = d.now()
        assert await d.ack(job.id, AckOptions(fence=job.fence))
        [done] = await d.attempt_log(job.id)
        assert (done.attempt, done.worker_id, done.outcome) == (1, "w1", "done")
        assert done.ended_at == pytest.approx(settled, abs=1e-3)
        await target.advance(5.0)
        await intro.requeue(job.id)
        assert await d.attempt_log(job.id) == [done]  # still done, still ended then
        again = await _one(d, "w2")
        log = await d.attempt_log(job.id)
        assert [(e.attempt, e.worker_id, e.outcome) for e in log] == [
            (1, "w1", "done"),
            (1, "w2", None),
        ]
        assert log[0] == done
        assert await d.nack(again.id, NackOptions(fence=again.fence, state="ready", counted=True))
        assert [e.outcome for e in await d.attempt_log(job.id)] == ["done", "retried"]

    async def test_a_cancel_of_a_running_job_closes_its_attempt(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        await d.enqueue_many([request(key="c"), request(key="w", delay=60)])
        job = await _one(d)
        await intro.cancel(job.id, reason="customer left")
        [entry] = (await intro.show(job.id)).attempt_log
        assert (entry.outcome, entry.error_code, entry.error) == (
            "cancelled",
            ErrorCode.X_ABORTED,
            CANCELLED_LINE,
        )
        assert not await d.ack(job.id, AckOptions(fence=job.fence))
        assert list((await intro.show(job.id)).attempt_log) == [entry]
        waiting = (await intro.list(ListFilter(state="delayed"))).rows[0]
        await intro.cancel(waiting.id)
        assert (await intro.show(waiting.id)).attempt_log == ()  # never claimed

    async def test_counters_say_which_queue_their_job_settled_in(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        start = d.now() - 1
        await d.enqueue_many([request("cq", key="a", queue="qa"), request("cq.b", key="b")])
        a = await _one(d, queue="qa")
        b = await _one(d)
        await d.ack(a.id, AckOptions(fence=a.fence))
        await d.nack(b.id, NackOptions(fence=b.fence, state="dead"))
        queues = {r.name: r.queue for r in await intro.counters(None, start)}
        assert queues == {"cq": "qa", "cq.b": "default"}

    # ------------------------------------------------------------------ steps

    async def test_a_step_record_keeps_when_it_started_and_ended(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="times")])
        job = await _one(d)
        t = d.now()
        started = StepRecord("pay", "started", 1, 1, started_at=t)
        assert await d.steps.put(job.id, job.fence, started)
        assert await d.steps.load(job.id) == [started]
        done = StepRecord(
            "pay", "completed", 1, 1, output={"ok": True}, started_at=t, ended_at=t + 2.5
        )
        assert await d.steps.put(job.id, job.fence, done)
        assert await d.steps.load(job.id) == [done]
        assert await d.nack(job.id, NackOptions(fence=job.fence, state="ready", counted=False))
        again = await _one(d)
        if again.steps is not None:
            assert list(again.steps) == [done]
        intro = d.introspect
        if intro is not None:
            [view] = (await intro.show(job.id)).steps
            assert (view.started_at, view.ended_at, view.duration) == (t, t + 2.5, 2.5)

    async def test_steps_are_fenced_ordered_and_replaced_in_place(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="s")])
        job = await _one(d)
        assert await d.steps.put(job.id, job.fence, StepRecord("b", "started", 1, 1))
        assert await d.steps.put(
            job.id, job.fence, StepRecord("a", "completed", 2, 1, output={"x": [1]})
        )
        assert await d.steps.put(
            job.id, job.fence, StepRecord("b", "completed", 1, 1, output="done")
        )
        records = await d.steps.load(job.id)
        assert [(r.name, r.status, r.output) for r in records] == [
            ("b", "completed", "done"),
            ("a", "completed", {"x": [1]}),
        ]
        assert not await d.steps.put(
            job.id, Fence("intruder", 999_999), StepRecord("c", "completed", 3, 1)
        )

    async def test_claim_may_carry_the_steps(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="s")])
        job = await _one(d)
        await d.steps.put(job.id, job.fence, StepRecord("a", "sleeping", 1, 1, wake_at=d.now() + 5))
        assert await d.nack(job.id, NackOptions(fence=job.fence, state="ready", counted=False))
        again = await _one(d)
        if again.steps is not None:
            assert [r.name for r in again.steps] == ["a"]
            assert again.steps[0].wake_at is not None

    # ------------------------------------------------------------------ events

    async def test_events_poll_from_since(self, target: Target) -> None:
        d = target.driver
        await d.events.publish("e", {"n": 1})
        _, now = await d.events.poll("e", float("inf"))
        await target.advance(1.0)
        await d.events.publish("e", {"n": 2})
        await d.events.publish("other", {"n": 3})
        found, _ = await d.events.poll("e", now + 0.5)
        assert [e.payload for e in found] == [{"n": 2}]

    async def test_publish_in_a_transaction_commits_or_vanishes(self, target: Target) -> None:
        d = target.driver

        async def rolled_back() -> None:
            async with d.transaction() as tx:
                await tx.publish("tx-e", {"n": 1})
                await tx.enqueue_many([request(key="tx-a")])
                raise RuntimeError("roll back")

        with pytest.raises(RuntimeError):
            await rolled_back()
        found, _ = await d.events.poll("tx-e", 0.0)
        assert found == []
        assert sum(s.ready for s in await d.stats()) == 0
        async with d.transaction() as tx:
            await tx.publish("tx-e", {"n": 2})
            out = await tx.enqueue_many([request(key="tx-b"), request(key="tx-b")])
            assert [o.deduped for o in out] == [False, True]
        found, _ = await d.events.poll("tx-e", 0.0)
        assert [e.payload for e in found] == [{"n": 2}]
        assert sum(s.ready for s in await d.stats()) == 1

    async def test_a_step_record_in_a_transaction_commits_or_vanishes_with_it(
        self, target: Target
    ) -> None:
        d = target.driver
        await d.enqueue_many([request(key="st")])
        job = await _one(d)
        record = StepRecord("t", "completed", 1, 1, output={"v": 1})

        async def rolled_back() -> None:
            async with d.transaction() as tx:
                assert await tx.put_step(job.id, job.fence, record)
                await tx.enqueue_many([request(key="st-a")])
                raise RuntimeError("roll back")

        with pytest.raises(RuntimeError):
            await rolled_back()
        assert await d.steps.load(job.id) == []
        assert sum(s.ready for s in await d.stats()) == 0
        async with d.transaction() as tx:
            assert await tx.put_step(job.id, job.fence, record)
            await tx.enqueue_many([request(key="st-b")])
        loaded = await d.steps.load(job.id)
        assert [(r.name, r.status, r.output) for r in loaded] == [("t", "completed", {"v": 1})]
        assert sum(s.ready for s in await d.stats()) == 1
        assert await d.ack(job.id, AckOptions(fence=job.fence))

    async def test_a_step_record_in_a_transaction_is_fenced(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many([request(key="sf")])
        job = await _one(d)
        record = StepRecord("t", "completed", 1, 1, output=1)

        class Refused(Exception):
            pass

        async def stale() -> None:
            async with d.transaction() as tx:
                await tx.enqueue_many([request(key="sf-a")])
                # A driver answers False at once, or stages and refuses at commit.
                if not await tx.put_step(job.id, Fence("intruder", 999_999), record):
                    raise Refused()

        with pytest.raises((Refused, JobsError)) as err:
            await stale()
        if isinstance(err.value, JobsError):
            assert err.value.code == ErrorCode.X_JOB_LEASE_LOST
        assert await d.steps.load(job.id) == []
        assert sum(s.ready for s in await d.stats()) == 0

    # ------------------------------------------------------------------ leases

    async def test_leases_hold_the_limit(self, target: Target) -> None:
        d = target.driver
        leases = _leases(d)
        await d.enqueue_many([request(key=f"l{i}") for i in range(3)])
        jobs = (await d.claim(_claim(n=3))).jobs
        grants = [await leases.acquire("cap", 2, j.id, j.fence, VT) for j in jobs]
        assert [g.slot is not None for g in grants] == [True, True, False]
        assert not grants[2].own
        assert await leases.held("cap") == 2
        # settling releases the slot
        assert await d.ack(jobs[0].id, AckOptions(fence=jobs[0].fence))
        assert await leases.held("cap") == 1
        g = await leases.acquire("cap", 2, jobs[2].id, jobs[2].fence, VT)
        assert g.slot is not None

    async def test_a_lease_reacquired_by_its_holder_is_kept(self, target: Target) -> None:
        d = target.driver
        leases = _leases(d)
        await d.enqueue_many([request(key="own")])
        job = await _one(d)
        first = await leases.acquire("own-key", 1, job.id, job.fence, VT)
        again = await leases.acquire("own-key", 1, job.id, job.fence, VT)
        assert first.slot == again.slot == 0

    async def test_a_leftover_lease_of_the_same_job_is_reported_own(self, target: Target) -> None:
        d = target.driver
        leases = _leases(d)
        await d.enqueue_many([request(key="left")])
        job = await _one(d)
        await leases.acquire("k1", 1, job.id, job.fence, VT * 10)
        # the job's lease lapses and it is claimed again while its slot lingers
        await target.advance(VT + 1)
        again = await _one(d, "w2")
        grant = await leases.acquire("k1", 1, again.id, again.fence, VT)
        assert grant.slot is None or grant.slot == 0
        if grant.slot is None:
            assert grant.own

    async def test_a_lapsed_claim_takes_no_lease(self, target: Target) -> None:
        d = target.driver
        leases = _leases(d)
        await d.enqueue_many([request(key="zombie")])
        old = await _one(d, "w1")
        await target.advance(VT + 1)
        new = await _one(d, "w2")
        assert (await leases.acquire("z", 1, old.id, old.fence, VT)).slot is None
        assert (await leases.acquire("z", 1, new.id, new.fence, VT)).slot == 0

    async def test_leases_expire_and_heartbeats_renew_them(self, target: Target) -> None:
        d = target.driver
        leases = _leases(d)
        await d.enqueue_many([request(key="a"), request(key="b")])
        a, b = (await d.claim(_claim(n=2))).jobs
        assert (await leases.acquire("exp", 1, a.id, a.fence, VT)).slot == 0
        await target.advance(VT * 0.6)
        assert await d.heartbeat(
            [HeartbeatRequest(a.id, a.fence), HeartbeatRequest(b.id, b.fence)], VT
        ) == [
            HeartbeatStatus.OK,
            HeartbeatStatus.OK,
        ]
        await target.advance(VT * 0.6)
        # a's slot was renewed by its heartbeat: still held
        assert (await leases.acquire("exp", 1, b.id, b.fence, VT)).slot is None
        assert await d.heartbeat([HeartbeatRequest(b.id, b.fence)], VT) == [HeartbeatStatus.OK]
        await target.advance(VT * 0.6)
        # a was not renewed for 1.2 windows: its slot expired
        assert (await leases.acquire("exp", 1, b.id, b.fence, VT)).slot == 0

    async def test_a_release_makes_the_first_waiting_run_due(self, target: Target) -> None:
        d = target.driver
        leases = _waking(d)
        await d.enqueue_many([request(key=k) for k in ("holder", "first", "second", "other")])
        holder, first, second, other = (await d.claim(_claim(n=4))).jobs
        assert (await leases.acquire("acct", 1, holder.id, holder.fence, VT)).slot == 0
        for job in (first, second):
            assert (await leases.acquire("acct", 1, job.id, job.fence, VT)).slot is None
            assert await d.nack(job.id, _busy(job, "acct"))
        # a hand-back with no busy key is not woken by the key's release
        assert await d.nack(
            other.id, NackOptions(fence=other.fence, state="ready", counted=False, delay=VT * 10)
        )
        await target.advance(1)
        assert (await d.claim(_claim())).jobs == []  # all wait
        assert await d.ack(holder.id, AckOptions(fence=holder.fence))
        # one slot came free: the first waiter is due, and only it
        [woken] = (await d.claim(_claim())).jobs
        assert woken.id == first.id
        assert woken.attempt == 1  # the busy hand-back burned no attempt
        assert (await leases.acquire("acct", 1, woken.id, woken.fence, VT)).slot == 0
        # a hand-back for good releases too: the next waiter is due
        assert await d.nack(woken.id, NackOptions(fence=woken.fence, state="dead"))
        assert [j.id for j in (await d.claim(_claim())).jobs] == [second.id]
        assert (await d.claim(_claim())).jobs == []

    async def test_a_busy_hand_back_whose_key_came_free_meanwhile_is_due_at_once(
        self, target: Target
    ) -> None:
        d = target.driver
        leases = _waking(d)
        await d.enqueue_many([request(key="holder"), request(key="late")])
        holder, late = (await d.claim(_claim(n=2))).jobs
        assert (await leases.acquire("freed", 1, holder.id, holder.fence, VT)).slot == 0
        assert (await leases.acquire("freed", 1, late.id, late.fence, VT)).slot is None
        # the holder settles between the busy acquire and the hand-back
        assert await d.ack(holder.id, AckOptions(fence=holder.fence))
        assert await d.nack(late.id, _busy(late, "freed"))
        assert [j.id for j in (await d.claim(_claim())).jobs] == [late.id]

    async def test_a_lapsed_holder_wakes_a_waiting_run_when_it_is_reaped(
        self, target: Target
    ) -> None:
        d = target.driver
        leases = _waking(d)
        await d.enqueue_many([request(key="holder")])
        holder = await _one(d)
        assert (await leases.acquire("reaped", 1, holder.id, holder.fence, VT)).slot == 0
        await d.enqueue_many([request(key="waiter")])
        waiter = await _one(d, "w2")
        assert (await leases.acquire("reaped", 1, waiter.id, waiter.fence, VT)).slot is None
        assert await d.nack(waiter.id, _busy(waiter, "reaped"))
        # the holder's worker died: its row lapses, and the claim that reaps it
        # releases its slot
        await target.advance(VT + 1)
        taken: list[str] = []
        for _ in range(2):  # the reap's claim, then the next one
            taken += [j.id for j in (await d.claim(_claim(worker="w3"))).jobs]
        assert sorted(taken) == sorted([holder.id, waiter.id])

    # ------------------------------------------------------------------ stats

    async def test_stats_count_per_queue_and_state(self, target: Target) -> None:
        d = target.driver
        await d.enqueue_many(
            [
                request(key="r1", queue="s1"),
                request(key="r2", queue="s1"),
                request(key="d1", queue="s2", delay=100.0),
            ]
        )
        await d.claim(ClaimOptions("w1", {"s1": 1}, VT))
        by_queue = {s.queue: s for s in await d.stats()}
        assert (by_queue["s1"].ready, by_queue["s1"].running) == (1, 1)
        assert by_queue["s2"].delayed == 1
        assert by_queue["s1"].depth == 1

    # ------------------------------------------------------------------ introspection

    async def test_show_and_not_found(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        req = request("shown", key="k", tenant_id="org1", concurrency_key="ck", payload={"a": 1})
        await d.enqueue_many([req])
        view = await intro.show(req.id)
        assert (view.id, view.run_id, view.name, view.queue, view.state) == (
            req.id,
            req.run_id,
            "shown",
            "default",
            "ready",
        )
        assert (view.tenant_id, view.idempotency_key, view.concurrency_key) == ("org1", "k", "ck")
        assert view.attempts == 0
        assert view.max_attempts == 3
        with pytest.raises(JobsError) as err:
            await intro.show(str(uuid.uuid4()))
        assert err.value.code == "X_JOB_NOT_FOUND"

    async def test_resolve_id_answers_the_one_job_a_prefix_names(self, target: Target) -> None:
        """``resolve_id``: the one job whose id starts with the prefix; none is
        ``X_JOB_NOT_FOUND``, several ``X_ID_AMBIGUOUS`` naming some of them."""
        d = target.driver
        intro = _intro(d)
        twins = ["6b63347c-1d2c-4c3b-9a8e-7f6d5c4b3a21", "6b63347c-1d2c-4c3b-9a8e-8f6d5c4b3a21"]
        lone = "6b63347d-0000-4000-8000-000000000001"
        await d.enqueue_many([request(key=f"r{i}", id=i_d) for i, i_d in enumerate([*twins, lone])])
        assert await intro.resolve_id("6b63347d") == lone
        assert await intro.resolve_id("6b63347d-0000-4") == lone
        assert await intro.resolve_id(twins[0][:25]) == twins[0]
        assert await intro.resolve_id(twins[1]) == twins[1]  # a whole id is its own prefix
        for prefix in ("6b63347c", "6b63347c-1d2c-4c3b-9a8e-"):
            with pytest.raises(JobsError) as err:
                await intro.resolve_id(prefix)
            assert err.value.code == "X_ID_AMBIGUOUS"
            assert err.value.meta["matches"] == twins
            assert twins[0] in err.value.message
        for prefix in ("6b63347e", "00000000", "ffffffff-ffff"):
            with pytest.raises(JobsError) as err:
                await intro.resolve_id(prefix)
            assert err.value.code == "X_JOB_NOT_FOUND"
        # A row staged in an open transaction is nobody's yet.
        async with d.transaction() as tx:
            await tx.enqueue_many(
                [request(key="staged", id="7a000000-0000-4000-8000-000000000000")]
            )
            with pytest.raises(JobsError) as err:
                await intro.resolve_id("7a000000")
            assert err.value.code == "X_JOB_NOT_FOUND"
        assert await intro.resolve_id("7a000000") == "7a000000-0000-4000-8000-000000000000"

    async def test_an_ambiguous_prefix_names_at_most_five_jobs(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        ids = [f"5a5a5a5a-0000-4000-8000-00000000000{i}" for i in range(8)]
        await d.enqueue_many([request(key=f"m{i}", id=i_d) for i, i_d in enumerate(ids)])
        with pytest.raises(JobsError) as err:
            await intro.resolve_id("5a5a5a5a")
        assert err.value.code == "X_ID_AMBIGUOUS"
        assert err.value.meta["matches"] == ids[:5]

    async def test_the_row_says_whether_its_job_is_sensitive(self, target: Target) -> None:
        # A reader holding no job handle (the CLI) redacts on the row's word.
        d = target.driver
        intro = _intro(d)
        secret = attrs.evolve(request("secret", key="s"), sensitive=True)
        plain = request("plain", key="p")
        alone = attrs.evolve(request("alone", key="a"), sensitive=True)
        await d.enqueue_many([secret, plain])
        await d.enqueue_many([alone])  # a driver may take one request another way
        assert (await intro.show(secret.id)).sensitive is True
        assert (await intro.show(plain.id)).sensitive is False
        assert (await intro.show(alone.id)).sensitive is True
        page = await intro.list(ListFilter())
        assert {v.id: v.sensitive for v in page.rows} == {
            secret.id: True,
            plain.id: False,
            alone.id: True,
        }

    async def test_list_pages_newest_first(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        ids = []
        for i in range(7):
            ids.append((await d.enqueue_many([request(key=f"p{i}")]))[0].id)
            await target.advance(1.0)
        page1 = await intro.list(ListFilter(limit=3))
        assert [r.id for r in page1.rows] == ids[::-1][:3]
        assert page1.before is None
        assert page1.after is not None
        page2 = await intro.list(ListFilter(limit=3, after=page1.after))
        assert [r.id for r in page2.rows] == ids[::-1][3:6]
        page3 = await intro.list(ListFilter(limit=3, after=page2.after))
        assert [r.id for r in page3.rows] == ids[::-1][6:]
        assert page3.after is None
        back = await intro.list(ListFilter(limit=3, before=page2.before))
        assert [r.id for r in back.rows] == ids[::-1][:3]

    async def test_list_refuses_bad_pages(self, target: Target) -> None:
        intro = _intro(target.driver)
        # The limit and the pair of cursors are refused where the filter is built
        # (ListFilter's validators); a cursor that does not decode, by the driver.
        for limit in (0, 201):
            with pytest.raises(JobsError) as err:
                ListFilter(limit=limit)
            assert err.value.code == "X_JOB_PAGE_INVALID"
        with pytest.raises(JobsError) as err:
            await intro.list(ListFilter(after="not-a-cursor"))
        assert err.value.code == "X_JOB_PAGE_INVALID"
        page = await intro.list(ListFilter(limit=1))
        with pytest.raises(JobsError) as err:
            ListFilter(after="x", before="y")
        assert err.value.code == "X_INVARIANT"
        assert page.rows == [] or len(page.rows) == 1

    async def test_list_filters(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        a = request("fa", key="1", queue="q1", tenant_id="t1")
        b = request("fb", key="2", queue="q2", tenant_id="t2")
        await d.enqueue_many([a])
        await target.advance(10.0)
        t_mid = d.now()
        await d.enqueue_many([b])
        assert [r.id for r in (await intro.list(ListFilter(queue="q1"))).rows] == [a.id]
        assert [r.id for r in (await intro.list(ListFilter(name="fb"))).rows] == [b.id]
        assert [r.id for r in (await intro.list(ListFilter(tenant_id="t2"))).rows] == [b.id]
        assert [r.id for r in (await intro.list(ListFilter(id_prefix=a.id[:8]))).rows] == [a.id]
        assert [r.id for r in (await intro.list(ListFilter(created_from=t_mid - 1))).rows] == [b.id]
        assert [r.id for r in (await intro.list(ListFilter(created_to=t_mid - 1))).rows] == [a.id]
        assert [r.id for r in (await intro.list(ListFilter(state="ready"))).rows] == [b.id, a.id]
        assert (await intro.list(ListFilter(state="dead"))).rows == []

    async def test_requeue_rules(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        req = request(key="rq")
        await d.enqueue_many([req])
        with pytest.raises(JobsError) as err:
            await intro.requeue(req.id)
        assert err.value.code == "X_JOB_NOT_REQUEUEABLE"
        job = await _one(d)
        await d.steps.put(job.id, job.fence, StepRecord("one", "completed", 1, 1, output=1))
        await d.steps.put(job.id, job.fence, StepRecord("two", "completed", 2, 1, output=2))
        await d.steps.put(job.id, job.fence, StepRecord("three", "failed", 3, 1, error="boom"))
        await d.nack(
            job.id, NackOptions(fence=job.fence, state="dead", error_code="X_E", last_error="X_E")
        )
        # a live job holding the key blocks the requeue
        live = request(key="rq")
        await d.enqueue_many([live])
        with pytest.raises(JobsError) as err:
            await intro.requeue(req.id)
        assert err.value.code == "X_JOB_DUPLICATE"
        await intro.cancel(live.id)
        view = await intro.requeue(req.id, from_step="two")
        assert view.state == "ready"
        assert [s.name for s in view.steps] == ["one"]
        with pytest.raises(JobsError) as err:
            await intro.requeue(str(uuid.uuid4()))
        assert err.value.code == "X_JOB_NOT_FOUND"

    async def test_cancel_rules(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        req = request(key="cx")
        await d.enqueue_many([req])
        view = await intro.cancel(req.id, "not needed")
        assert view.state == "cancelled"
        with pytest.raises(JobsError) as err:
            await intro.cancel(req.id)
        assert err.value.code == "X_JOB_NOT_CANCELLABLE"
        assert not (await d.enqueue_many([request(key="cx")]))[0].deduped

    async def test_remove_rules(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        a, b = request(key="ra"), request(key="rb")
        await d.enqueue_many([a, b])
        running = await _one(d)
        with pytest.raises(JobsError) as err:
            await intro.remove(running.id)
        assert err.value.code == "X_JOB_NOT_REMOVABLE"
        other = b.id if running.id == a.id else a.id
        await intro.remove(other)
        with pytest.raises(JobsError) as err:
            await intro.show(other)
        assert err.value.code == "X_JOB_NOT_FOUND"

    async def test_bulk_operations_are_bounded(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        n = MAX_BULK_ROWS + 5
        for start in range(0, n, 1000):
            await d.enqueue_many(
                [
                    request("bulk", key=f"b{i}", delay=100.0)
                    for i in range(start, min(n, start + 1000))
                ]
            )
        first = await intro.promote_many(BulkFilter(state="delayed", name="bulk"))
        assert (first.affected, first.remaining) == (MAX_BULK_ROWS, 5)
        second = await intro.promote_many(BulkFilter(state="delayed", name="bulk"))
        assert (second.affected, second.remaining) == (5, 0)
        removed = await intro.remove_many(BulkFilter(state="ready", name="bulk"))
        assert (removed.affected, removed.remaining) == (MAX_BULK_ROWS, 5)
        removed = await intro.remove_many(BulkFilter(state="ready", name="bulk"))
        assert (removed.affected, removed.remaining) == (5, 0)

    async def test_requeue_many_skips_rows_whose_key_is_live(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        await d.enqueue_many([request("rm", key=f"k{i}") for i in range(3)])
        for job in (await d.claim(_claim(n=3))).jobs:
            await d.nack(job.id, NackOptions(fence=job.fence, state="dead"))
        await d.enqueue_many([request("rm", key="k0")])  # a live job now holds k0
        result = await intro.requeue_many(BulkFilter(state="dead", name="rm"))
        assert (result.affected, result.remaining) == (2, 0)
        stats = await d.stats()
        assert sum(s.dead for s in stats) == 1
        assert sum(s.ready for s in stats) == 3

    async def test_a_bulk_preview_counts_and_samples_what_the_bulk_call_then_moves(
        self, target: Target
    ) -> None:
        """``preview_many`` writes nothing; its count is what the bulk call then
        moves (called until nothing remains) and its sample the first of those
        rows, oldest first; it refuses what the bulk call refuses."""
        d = target.driver
        intro = _intro(d)
        # requeue: k0 is held by a live job, k1 has two dead rows (one moves).
        reqs = [request("pv", key=k) for k in ("k0", "k1", "k2", "k1")]
        for req in reqs:
            await d.enqueue_many([req])
            job = await _one(d)
            await d.nack(job.id, NackOptions(fence=job.fence, state="dead"))
            await target.advance(1.0)
        await d.enqueue_many([request("pv", key="k0")])
        before = await d.stats()
        preview = await intro.preview_many("requeue", BulkFilter(state="dead", name="pv"), 5)
        assert preview.count == 2
        assert [v.id for v in preview.sample] == [reqs[1].id, reqs[2].id]
        assert all(v.state == "dead" and v.name == "pv" for v in preview.sample)
        assert await d.stats() == before  # nothing moved
        short = await intro.preview_many("requeue", BulkFilter(state="dead", name="pv"), 1)
        assert (short.count, [v.id for v in short.sample]) == (2, [reqs[1].id])
        moved = await intro.requeue_many(BulkFilter(state="dead", name="pv"))
        assert moved.affected == preview.count
        assert {(await intro.show(v.id)).state for v in preview.sample} == {"ready"}
        # remove: every matching row; promote: the delayed ones.
        await d.enqueue_many([request("pv2", key=f"d{i}", delay=100.0) for i in range(3)])
        removal = await intro.preview_many("remove", BulkFilter(state="delayed", name="pv2"), 0)
        assert (removal.count, list(removal.sample)) == (3, [])
        promotion = await intro.preview_many("promote", BulkFilter(state="delayed"), 2)
        assert promotion.count == 3
        assert len(promotion.sample) == 2
        assert (await intro.promote_many(BulkFilter(state="delayed"))).affected == 3
        nothing = await intro.preview_many("promote", BulkFilter(state="delayed"), 5)
        assert (nothing.count, list(nothing.sample)) == (0, [])
        for action, state, code in (
            ("remove", "running", "X_JOB_NOT_REMOVABLE"),
            ("requeue", "ready", "X_JOB_NOT_REQUEUEABLE"),
            ("promote", "done", "X_INVARIANT"),
        ):
            with pytest.raises(JobsError) as err:
                await intro.preview_many(action, BulkFilter(state=state), 5)
            assert err.value.code == code

    async def test_promote_rules(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        later = request(key="pl", delay=100.0)
        now_ = request(key="pn")
        await d.enqueue_many([later, now_])
        with pytest.raises(JobsError):
            await intro.promote(now_.id)
        view = await intro.promote(later.id)
        assert view.state == "ready"
        claimed = (await d.claim(_claim(n=5))).jobs
        promoted = [j for j in claimed if j.id == later.id]
        assert promoted
        assert promoted[0].promoted
        with pytest.raises(JobsError):
            await intro.promote_many(BulkFilter(state="done"))

    async def test_resolve_step(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        await d.enqueue_many([request(key="rs")])
        job = await _one(d)
        await d.steps.put(job.id, job.fence, StepRecord("pay", "started", 1, 1))
        await d.steps.put(job.id, job.fence, StepRecord("ship", "started", 2, 1))
        await d.nack(job.id, NackOptions(fence=job.fence, state="dead"))
        await intro.resolve_step(job.id, "pay", ran=True, output={"charge": "c1"})
        await intro.resolve_step(job.id, "ship", ran=False)
        records = {r.name: r for r in await d.steps.load(job.id)}
        assert records["pay"].status == "completed"
        assert records["pay"].output == {"charge": "c1"}
        assert "ship" not in records
        with pytest.raises(JobsError):
            await intro.resolve_step(job.id, "pay", ran=False)

    async def test_workers_registry_expires(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        info = WorkerInfo(
            id="wk1",
            host="h",
            pid=1,
            started_at=d.now(),
            queues=["default"],
            slots={"default": 4},
            in_flight=["j1"],
        )
        await intro.record_worker(info, VT)
        rows = await intro.workers()
        assert [w.id for w in rows] == ["wk1"]
        assert list(rows[0].in_flight) == ["j1"]
        await target.advance(VT + 1)
        assert await intro.workers() == []
        await intro.record_worker(info, VT)
        await intro.remove_worker("wk1")
        assert await intro.workers() == []

    async def test_counters(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        start = d.now() - 1
        await d.enqueue_many([request("cnt", key=f"c{i}") for i in range(4)])
        a, b, c, e = (await d.claim(_claim(n=4))).jobs
        await d.ack(a.id, AckOptions(fence=a.fence, duration=2.0))
        await d.nack(b.id, NackOptions(fence=b.fence, state="ready", counted=True, delay=50))
        await d.nack(c.id, NackOptions(fence=c.fence, state="dead"))
        await d.nack(e.id, NackOptions(fence=e.fence, state="failed"))
        rows = await intro.counters("cnt", start)
        totals = [sum(getattr(r, f) for r in rows) for f in ("done", "retried", "failed", "dead")]
        assert totals == [1, 1, 1, 1]
        assert sum(r.duration for r in rows) == pytest.approx(2.0)
        assert await intro.counters("other", start) == []

    async def test_paused_queues_listing(self, target: Target) -> None:
        intro = _intro(target.driver)
        await intro.pause_queue("pz")
        await intro.pause_queue("pa")
        assert await intro.paused_queues() == ["pa", "pz"]
        await intro.resume_queue("pz")
        assert await intro.paused_queues() == ["pa"]

    async def test_wake_announces_new_work(self, target: Target) -> None:
        d = target.driver
        if d.wake is None:
            pytest.skip(f"the {d.name} driver pushes no wake-ups")
        woke: list[bool] = []

        async def waiter() -> None:
            woke.append(await d.wake.wait(["default"], 5.0))  # type: ignore[union-attr]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(0.05)
            await d.enqueue_many([request(key="wake")])
        assert woke == [True]

    # ------------------------------------------------------------------ retention

    async def test_purge_takes_terminal_rows_after_their_retention_and_never_a_live_one(
        self, target: Target
    ) -> None:
        d = target.driver
        intro = _intro(d)
        day = 86_400.0
        await d.enqueue_many([request("ret", key=f"r{i}") for i in range(5)])
        far = (await d.enqueue_many([request("ret", key="far", delay=365 * day)]))[0]
        done, dead, failed, cancelled, running = (await d.claim(_claim(n=5))).jobs
        assert await d.steps.put(done.id, done.fence, StepRecord("s", "completed", 1, 1, output=1))
        assert await d.ack(done.id, AckOptions(fence=done.fence))
        assert await d.nack(dead.id, NackOptions(fence=dead.fence, state="dead"))
        assert await d.nack(failed.id, NackOptions(fence=failed.fence, state="failed"))
        assert await d.nack(cancelled.id, NackOptions(fence=cancelled.fence, state="ready"))
        await intro.cancel(cancelled.id)

        async def purge() -> int:
            now = d.now()
            return int(await intro.purge(now - 14 * day, now - 90 * day, 1_000))

        async def states() -> dict[str, str]:
            rows = (await intro.list(ListFilter(limit=50))).rows
            return {r.id: r.state for r in rows}

        await target.advance(14 * day - 60)
        assert await purge() == 0
        await target.advance(120)
        assert await purge() == 1  # the done row, 14 days after it settled
        left = await states()
        assert done.id not in left
        assert await d.steps.load(done.id) == []
        assert left[running.id] == "running"  # its lease lapsed long ago: still live
        await target.advance(76 * day)
        assert await purge() == 3  # dead, failed and cancelled, 90 days after
        assert sorted(await states()) == sorted([running.id, far.id])
        await target.advance(365 * day)
        assert await purge() == 0  # a live row never goes, however old
        assert len(await states()) == 2

    async def test_purge_takes_at_most_its_limit(self, target: Target) -> None:
        d = target.driver
        intro = _intro(d)
        await d.enqueue_many([request("ret", key=f"l{i}") for i in range(3)])
        for job in (await d.claim(_claim(n=3))).jobs:
            assert await d.ack(job.id, AckOptions(fence=job.fence))
        await target.advance(15 * 86_400.0)
        now = d.now()
        assert await intro.purge(now - 14 * 86_400.0, now - 90 * 86_400.0, 2) == 2
        assert await intro.purge(now - 14 * 86_400.0, now - 90 * 86_400.0, 2) == 1

    async def test_purge_counts_a_done_row_from_its_settle_not_its_enqueue(
        self, target: Target
    ) -> None:
        """A row enqueued long before the cut but settled after it stays (the
        PostgreSQL purge finds done rows through the listing index, by created_at:
        the settle time still decides); done and buried rows share one limit."""
        d = target.driver
        intro = _intro(d)
        day = 86_400.0
        await d.enqueue_many([request("ret", key="old", delay=30 * day)])
        await d.enqueue_many([request("ret", key=f"m{i}") for i in range(3)])
        await target.advance(30 * day)
        jobs = (await d.claim(_claim(n=4))).jobs
        for job in jobs[:3]:
            assert await d.ack(job.id, AckOptions(fence=job.fence))
        assert await d.nack(jobs[3].id, NackOptions(fence=jobs[3].fence, state="dead"))
        now = d.now()
        assert await intro.purge(now - 14 * day, now - 90 * day, 1_000) == 0
        await target.advance(91 * day)
        now = d.now()
        assert await intro.purge(now - 14 * day, now - 90 * day, 3) == 3
        assert await intro.purge(now - 14 * day, now - 90 * day, 3) == 1
        assert (await intro.list(ListFilter(limit=50))).rows == []

    async def test_open_in_holds_the_driver_open_for_its_block(self, target: Target) -> None:
        """``open_in(nursery)`` (what ``open_jobs`` enters) opens the driver for the
        block and closes it on the way out, its tasks gone with the nursery."""
        d = target.driver
        await d.close()
        async with trio.open_nursery() as nursery:
            async with d.open_in(nursery):
                assert not d.closed
                assert len(await d.enqueue_many([request(key="in-block")])) == 1
            assert d.closed
        with pytest.raises(JobsError) as err:
            await d.enqueue_many([request(key="after-block")])
        assert err.value.code == "X_DRIVER_UNAVAILABLE"
        await d.open()

    async def test_a_closed_driver_is_unavailable(self, target: Target) -> None:
        d = target.driver
        await d.close()
        with pytest.raises(JobsError) as err:
            await d.enqueue_many([request(key="closed")])
        assert err.value.code == "X_DRIVER_UNAVAILABLE"
        await d.open()
