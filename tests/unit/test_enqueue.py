"""Enqueue, through the ambient facade, on the memory driver.

Spec sections "The fluent surface" (``enqueue``, ``enqueueMany``, ``.as``, the
tenant check at enqueue, ``X_ID_INVALID``), "Transactional outbox by default",
"Idempotency is in the type signature" (the live-key table), "Driver interface"
(``setJobDriver``); PYTHON-API.md "The handle" and "Wiring".
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio

from trio_jobs import (
    MAX_ENQUEUE_BATCH,
    Actor,
    ErrorCode,
    JobContext,
    Jobs,
    JobsError,
    Worker,
    _ambient,
    acting_as,
    cross_tenant,
    current_jobs,
    job,
    memory_driver,
    open_jobs,
    publish_event,
    set_job_driver,
)
from trio_jobs import _facade as facade_mod
from trio_jobs.drivers import ClaimOptions, JobView, MemoryDriver, NackOptions
from trio_jobs.testing import open_harness

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ORG_A = "org-a"
ORG_B = "org-b"


@attrs.frozen
class Onboard:
    org_id: str
    note: str = ""


ran: list[str] = []


async def _body(ctx: JobContext[Onboard]) -> None:
    ran.append(ctx.job_id)


onboard = job(
    name="onboard",
    input=Onboard,
    tenant=lambda i: i.org_id,
    idempotency_key=lambda i: f"onboard:{i.org_id}",
)(_body)

# Same key shape, another job: keys are scoped by job name.
welcome = job(
    name="welcome",
    input=Onboard,
    tenant=lambda i: i.org_id,
    idempotency_key=lambda i: f"onboard:{i.org_id}",
)(_body)

# No declared tenant: never compared; the row's tenant is whatever the enqueue says.
untenanted = job(
    name="untenanted",
    input=Onboard,
    tenant="none",
    idempotency_key=lambda i: f"untenanted:{i.org_id}",
)(_body)

# A key derived from a field that may be empty.
by_note = job(
    name="by-note",
    input=Onboard,
    tenant="none",
    idempotency_key=lambda i: i.note,
)(_body)


@job(name="counted", input=int, idempotency_key=lambda n: f"n:{n}")
async def counted(ctx: JobContext[int]) -> None:
    return None


ALL = [onboard, welcome, untenanted, by_note, counted]


@pytest.fixture
async def jobs() -> AsyncIterator[Jobs]:
    ran.clear()
    async with open_jobs(memory_driver(), jobs=ALL) as facade:
        yield facade


async def rows(jobs: Jobs) -> list[JobView]:
    """Every committed row, whatever its state (the memory driver keeps them all)."""
    return list((await jobs.list(limit=200)).rows)


async def queued(jobs: Jobs) -> int:
    return sum(
        s.ready + s.delayed + s.running + s.suspended + s.done + s.failed + s.dead + s.cancelled
        for s in await jobs.stats()
    )


async def in_transaction(jobs: Jobs, work: Callable[[], Awaitable[Any]], exc: BaseException) -> Any:
    """Run ``work`` in ``jobs.transaction()``, then raise ``exc`` inside it (a rollback)."""
    async with jobs.transaction():
        await work()
        raise exc


async def assert_nothing_written(jobs: Jobs) -> None:
    assert await queued(jobs) == 0
    assert await rows(jobs) == []


def actor(org: str | None, *perms: str) -> Actor:
    return Actor(id=f"user-{org}", org_id=org, permissions=frozenset(perms))


# --------------------------------------------------------------------------- ids


async def test_enqueued_ids_are_lowercase_canonical_uuid_strs(jobs: Jobs) -> None:
    got = await onboard.enqueue(Onboard(ORG_A))
    assert got.deduped is False
    for value in (got.id, got.run_id):
        assert type(value) is str
        assert UUID_RE.fullmatch(value), value
        assert str(uuid.UUID(value)) == value
    assert got.id != got.run_id
    view = await jobs.show(got.id)
    assert (view.id, view.run_id, view.state) == (got.id, got.run_id, "ready")
    assert view.name == "onboard"
    assert view.queue == "default"


async def test_run_id_is_accepted_as_a_str(jobs: Jobs) -> None:
    run_id = str(uuid.uuid4())
    got = await onboard.enqueue(Onboard(ORG_A), run_id=run_id)
    assert got.run_id == run_id
    assert (await jobs.show(got.id)).run_id == run_id


async def test_run_id_is_accepted_as_a_uuid(jobs: Jobs) -> None:
    run_id = uuid.UUID("0192A3B4-C5D6-7E8F-9012-3456789ABCDE")
    got = await onboard.enqueue(Onboard(ORG_A), run_id=run_id)
    assert got.run_id == "0192a3b4-c5d6-7e8f-9012-3456789abcde"
    assert type(got.run_id) is str


BAD_RUN_IDS = [
    "0192A3B4-C5D6-7E8F-9012-3456789ABCDE",  # not lowercase
    "{0192a3b4-c5d6-7e8f-9012-3456789abcde}",
    "urn:uuid:0192a3b4-c5d6-7e8f-9012-3456789abcde",
    "0192a3b4c5d67e8f90123456789abcde",  # not canonical
    " 0192a3b4-c5d6-7e8f-9012-3456789abcde",
    "0192a3b4-c5d6-7e8f-9012-3456789abcde\n",
    "run-1",
    "",
    42,
    b"0192a3b4-c5d6-7e8f-9012-3456789abcde",
    ["0192a3b4-c5d6-7e8f-9012-3456789abcde"],
]


@pytest.mark.parametrize("run_id", BAD_RUN_IDS, ids=repr)
async def test_a_bad_run_id_is_x_id_invalid_with_nothing_queued(jobs: Jobs, run_id: Any) -> None:
    with pytest.raises(JobsError) as caught:
        await onboard.enqueue(Onboard(ORG_A), run_id=run_id)
    assert caught.value.code == ErrorCode.X_ID_INVALID
    await assert_nothing_written(jobs)


@pytest.mark.parametrize("run_id", BAD_RUN_IDS[:3], ids=repr)
async def test_a_bad_run_id_is_refused_inside_a_transaction_too(jobs: Jobs, run_id: Any) -> None:
    async with jobs.transaction():
        with pytest.raises(JobsError) as caught:
            await onboard.enqueue_as(actor(ORG_A), Onboard(ORG_A), run_id=run_id)
        assert caught.value.code == ErrorCode.X_ID_INVALID
    await assert_nothing_written(jobs)


# --------------------------------------------------------------------------- live-key dedupe


async def test_a_live_key_dedupes_and_the_first_payload_wins(jobs: Jobs) -> None:
    first = await onboard.enqueue(Onboard(ORG_A, note="first"))
    second = await onboard.enqueue(Onboard(ORG_A, note="second"), run_id=str(uuid.uuid4()))
    assert second.deduped is True
    assert (second.id, second.run_id) == (first.id, first.run_id)  # the live row's ids
    assert len(await rows(jobs)) == 1
    assert (await jobs.show(first.id)).payload == {"org_id": ORG_A, "note": "first"}


async def test_the_key_is_scoped_by_job_name(jobs: Jobs) -> None:
    a = await onboard.enqueue(Onboard(ORG_A))
    b = await welcome.enqueue(Onboard(ORG_A))
    assert b.deduped is False
    assert a.id != b.id
    assert len(await rows(jobs)) == 2


async def test_the_key_is_scoped_by_tenant(jobs: Jobs) -> None:
    a = await untenanted.enqueue(Onboard("x"), tenant_id=ORG_A)
    b = await untenanted.enqueue(Onboard("x"), tenant_id=ORG_B)
    c = await untenanted.enqueue(Onboard("x"))
    again = await untenanted.enqueue(Onboard("x"), tenant_id=ORG_B)
    assert [a.deduped, b.deduped, c.deduped] == [False, False, False]
    assert len({a.id, b.id, c.id}) == 3
    assert again.deduped is True
    assert again.id == b.id
    tenants = sorted((v.tenant_id or "") for v in await rows(jobs))
    assert tenants == ["", ORG_A, ORG_B]


@pytest.mark.parametrize("live", ["ready", "delayed", "running", "suspended"])
async def test_every_live_state_holds_the_key(jobs: Jobs, live: str) -> None:
    first = await onboard.enqueue(Onboard(ORG_A), delay="1h" if live == "delayed" else None)
    if live in ("running", "suspended"):
        claimed = await jobs.driver.claim(
            ClaimOptions(worker_id="w1", queues={"default": 1}, visibility_timeout=30.0)
        )
        assert [c.id for c in claimed.jobs] == [first.id]
    if live == "suspended":  # what a step.wait_for_event hand-back does
        landed = await jobs.driver.nack(
            first.id,
            NackOptions(
                fence=claimed.jobs[0].fence,
                state="suspended",
                counted=False,
                delay=3600.0,
                waiting_event="invoice.paid",
            ),
        )
        assert landed
    assert (await jobs.show(first.id)).state == live
    again = await onboard.enqueue(Onboard(ORG_A, note="later"))
    assert again.deduped is True
    assert again.id == first.id


async def test_after_a_cancel_the_same_key_enqueues_a_new_job(jobs: Jobs) -> None:
    first = await onboard.enqueue(Onboard(ORG_A))
    await jobs.cancel(first.id, reason="test")
    assert (await jobs.show(first.id)).state == "cancelled"
    second = await onboard.enqueue(Onboard(ORG_A))
    assert second.deduped is False
    assert second.id != first.id
    assert (await jobs.show(second.id)).state == "ready"


async def test_after_the_row_is_done_the_same_key_enqueues_a_new_job(autojump_clock: Any) -> None:
    ran.clear()
    async with open_harness(jobs=[onboard]) as h:
        trace = await h.run(onboard, Onboard(ORG_A))
        assert trace.state == "done"
        again = await onboard.enqueue(Onboard(ORG_A))
        assert again.deduped is False
        assert again.id != trace.job_id
        assert (await h.jobs.show(again.id)).state == "ready"


self_enqueued: list[Any] = []


@job(name="rearm", input=Onboard, idempotency_key=lambda i: f"rearm:{i.org_id}")
async def rearm(ctx: JobContext[Onboard]) -> None:
    self_enqueued.append((ctx.job_id, ctx.run_id, await rearm.enqueue(ctx.input)))


async def test_a_job_enqueueing_itself_dedupes_onto_its_running_row(autojump_clock: Any) -> None:
    self_enqueued.clear()
    async with open_harness(jobs=[rearm]) as h:
        trace = await h.run(rearm, Onboard(ORG_A))
        assert trace.state == "done"
        [(job_id, run_id, got)] = self_enqueued
        assert got.deduped is True
        assert (got.id, got.run_id) == (job_id, run_id)
        assert len((await h.jobs.list()).rows) == 1  # no later run exists


# --------------------------------------------------------------------------- enqueue_many


async def test_enqueue_many_answers_one_result_per_input_in_order(jobs: Jobs) -> None:
    orgs = [f"org-{i}" for i in range(5)]
    got = await onboard.enqueue_many(Onboard(o) for o in orgs)
    assert len(got) == 5
    assert not any(g.deduped for g in got)
    assert len({g.id for g in got}) == 5
    for org, result in zip(orgs, got, strict=True):
        view = await jobs.show(result.id)
        assert view.tenant_id == org
        assert view.payload["org_id"] == org
        assert view.run_id == result.run_id
        assert UUID_RE.fullmatch(result.id)


async def test_two_inputs_sharing_a_key_are_one_job_the_second_deduped(jobs: Jobs) -> None:
    got = await onboard.enqueue_many(
        [Onboard(ORG_A, note="first"), Onboard(ORG_B), Onboard(ORG_A, note="second")]
    )
    assert [g.deduped for g in got] == [False, False, True]
    assert (got[2].id, got[2].run_id) == (got[0].id, got[0].run_id)
    assert len(await rows(jobs)) == 2
    assert (await jobs.show(got[0].id)).payload["note"] == "first"


async def test_enqueue_many_dedupes_onto_an_already_live_row(jobs: Jobs) -> None:
    live = await onboard.enqueue(Onboard(ORG_A))
    got = await onboard.enqueue_many([Onboard(ORG_B), Onboard(ORG_A)])
    assert [g.deduped for g in got] == [False, True]
    assert got[1].id == live.id


@pytest.mark.parametrize(("count", "round_trips"), [(1, 1), (1_000, 1), (1_001, 2), (2_500, 3)])
async def test_enqueue_many_is_one_round_trip_per_1000_inputs(
    jobs: Jobs, monkeypatch: pytest.MonkeyPatch, count: int, round_trips: int
) -> None:
    driver = jobs.driver
    calls: list[int] = []
    real = driver.enqueue_many

    async def counting(requests: Any) -> Any:
        calls.append(len(requests))
        return await real(requests)

    monkeypatch.setattr(driver, "enqueue_many", counting)
    got = await counted.enqueue_many(range(count))
    assert len(got) == count
    assert len(calls) == round_trips
    assert sum(calls) == count
    assert max(calls) <= 1_000


async def test_enqueue_many_of_nothing_writes_nothing(jobs: Jobs) -> None:
    assert await onboard.enqueue_many([]) == []
    await assert_nothing_written(jobs)


async def test_past_max_enqueue_batch_is_refused_before_any_write(jobs: Jobs) -> None:
    assert MAX_ENQUEUE_BATCH == 10_000
    with pytest.raises(JobsError) as caught:
        await counted.enqueue_many(range(MAX_ENQUEUE_BATCH + 1))
    assert caught.value.code == ErrorCode.X_JOB_ENQUEUE_BATCH_TOO_LARGE
    await assert_nothing_written(jobs)


async def test_exactly_max_enqueue_batch_is_accepted(jobs: Jobs) -> None:
    got = await counted.enqueue_many(range(MAX_ENQUEUE_BATCH))
    assert len(got) == MAX_ENQUEUE_BATCH
    assert not any(g.deduped for g in got)
    [stats] = await jobs.stats()
    assert stats.ready == MAX_ENQUEUE_BATCH


@pytest.mark.parametrize("at", [0, 1_500, 2_999])
async def test_an_empty_key_in_any_input_refuses_the_whole_call(jobs: Jobs, at: int) -> None:
    inputs = [Onboard(f"org-{i}", note=f"n{i}") for i in range(3_000)]
    inputs[at] = Onboard("org-x", note="")
    with pytest.raises(JobsError) as caught:
        await by_note.enqueue_many(inputs)
    assert caught.value.code == ErrorCode.X_INVARIANT
    await assert_nothing_written(jobs)


async def test_one_bad_input_refuses_the_whole_call(jobs: Jobs) -> None:
    inputs: list[Any] = [Onboard(f"org-{i}") for i in range(1_200)]
    inputs[1_100] = {"org_id": 7}
    with pytest.raises(JobsError) as caught:
        await onboard.enqueue_many(inputs)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    await assert_nothing_written(jobs)


async def test_one_mismatched_tenant_refuses_the_whole_call(jobs: Jobs) -> None:
    with pytest.raises(JobsError) as caught:
        await onboard.enqueue_many([Onboard(ORG_A), Onboard(ORG_B)], tenant_id=ORG_A)
    assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    await assert_nothing_written(jobs)


async def test_enqueue_many_in_a_rolled_back_transaction_vanishes_whole(jobs: Jobs) -> None:
    answered: list[Any] = []

    async def work() -> None:
        answered.extend(await counted.enqueue_many(range(2_500)))

    with pytest.raises(_Rollback):
        await in_transaction(jobs, work, _Rollback())
    assert len(answered) == 2_500
    await assert_nothing_written(jobs)


# --------------------------------------------------------------------------- tenants


async def test_the_row_tenant_is_the_declared_tenant(jobs: Jobs) -> None:
    got = await onboard.enqueue(Onboard(ORG_A))
    assert (await jobs.show(got.id)).tenant_id == ORG_A
    none = await untenanted.enqueue(Onboard(ORG_A))
    assert (await jobs.show(none.id)).tenant_id is None


async def test_tenant_id_naming_the_declared_org_is_accepted(jobs: Jobs) -> None:
    got = await onboard.enqueue(Onboard(ORG_A), tenant_id=ORG_A)
    assert (await jobs.show(got.id)).tenant_id == ORG_A


async def test_tenant_id_of_another_org_is_a_mismatch_before_anything_is_queued(jobs: Jobs) -> None:
    with pytest.raises(JobsError) as caught:
        await onboard.enqueue(Onboard(ORG_A), tenant_id=ORG_B)
    assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    await assert_nothing_written(jobs)


async def test_enqueue_as_an_actor_of_another_org_is_a_mismatch(jobs: Jobs) -> None:
    with pytest.raises(JobsError) as caught:
        await onboard.enqueue_as(actor(ORG_B), Onboard(ORG_A))
    assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    await assert_nothing_written(jobs)


async def test_an_ambient_actor_of_another_org_is_a_mismatch(jobs: Jobs) -> None:
    with acting_as(actor(ORG_B)):
        with pytest.raises(JobsError) as caught:
            await onboard.enqueue(Onboard(ORG_A))
        assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
        with pytest.raises(JobsError) as caught:
            await onboard.enqueue_many([Onboard(ORG_B), Onboard(ORG_A)])
        assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    await assert_nothing_written(jobs)


async def test_an_ambient_actor_of_the_same_org_is_accepted(jobs: Jobs) -> None:
    with acting_as(actor(ORG_A)):
        got = await onboard.enqueue(Onboard(ORG_A))
    assert (await jobs.show(got.id)).tenant_id == ORG_A


async def test_an_actor_with_no_org_is_never_compared(jobs: Jobs) -> None:
    with acting_as(actor(None)):
        ambient = await onboard.enqueue(Onboard(ORG_A))
    explicit = await onboard.enqueue_as(actor(None), Onboard(ORG_B))
    nobody = await welcome.enqueue_as(None, Onboard(ORG_B))
    assert (await jobs.show(ambient.id)).tenant_id == ORG_A
    assert (await jobs.show(explicit.id)).tenant_id == ORG_B  # unset: the declared tenant
    assert (await jobs.show(nobody.id)).tenant_id == ORG_B


async def test_tenant_none_is_never_compared(jobs: Jobs) -> None:
    with acting_as(actor(ORG_B)):
        ambient = await untenanted.enqueue(Onboard(ORG_A))
    explicit = await untenanted.enqueue(Onboard("other"), tenant_id=ORG_B)
    assert (await jobs.show(ambient.id)).tenant_id is None
    assert (await jobs.show(explicit.id)).tenant_id == ORG_B


async def test_cross_tenant_admits_the_ambient_case_for_an_actor_holding_tenancy_cross(
    jobs: Jobs,
) -> None:
    with acting_as(actor(ORG_B, "tenancy:cross")):
        with cross_tenant("support: re-run onboarding for org-a"):
            got = await onboard.enqueue(Onboard(ORG_A))
            many = await welcome.enqueue_many([Onboard(ORG_A)])
        # outside the block the check is back
        with pytest.raises(JobsError) as caught:
            await onboard.enqueue(Onboard("org-c"))
        assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    assert (await jobs.show(got.id)).tenant_id == ORG_A  # the row keeps the declared tenant
    assert (await jobs.show(many[0].id)).tenant_id == ORG_A


async def test_cross_tenant_without_the_permission_is_forbidden(jobs: Jobs) -> None:
    with acting_as(actor(ORG_B, "jobs:write")):
        with pytest.raises(JobsError) as caught:
            with cross_tenant("because"):
                pytest.fail("cross_tenant admitted an actor without tenancy:cross")
        assert caught.value.code == ErrorCode.X_FORBIDDEN


async def test_cross_tenant_without_an_ambient_actor_is_forbidden(jobs: Jobs) -> None:
    with pytest.raises(JobsError) as caught:
        with cross_tenant("because"):
            pytest.fail("cross_tenant admitted nobody")
    assert caught.value.code == ErrorCode.X_FORBIDDEN


@pytest.mark.parametrize("reason", ["", "   ", None, 3], ids=repr)
async def test_cross_tenant_needs_a_reason(jobs: Jobs, reason: Any) -> None:
    with acting_as(actor(ORG_B, "tenancy:cross")):
        with pytest.raises(JobsError) as caught:
            with cross_tenant(reason):
                pytest.fail("cross_tenant admitted a blank reason")
        assert caught.value.code == ErrorCode.X_INVARIANT


async def test_cross_tenant_never_admits_an_explicit_tenant_id_or_enqueue_as(jobs: Jobs) -> None:
    with acting_as(actor(ORG_B, "tenancy:cross")), cross_tenant("support"):
        with pytest.raises(JobsError) as caught:
            await onboard.enqueue(Onboard(ORG_A), tenant_id=ORG_B)
        assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
        with pytest.raises(JobsError) as caught:
            await onboard.enqueue_as(actor(ORG_B, "tenancy:cross"), Onboard(ORG_A))
        assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
        with pytest.raises(JobsError) as caught:
            await onboard.enqueue_many([Onboard(ORG_A)], tenant_id=ORG_B)
        assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    await assert_nothing_written(jobs)


async def test_cross_tenant_admits_only_the_actor_holding_the_permission(jobs: Jobs) -> None:
    with acting_as(actor(ORG_B, "tenancy:cross")), cross_tenant("support"):
        with acting_as(actor("org-c")):  # someone else acting inside the block
            with pytest.raises(JobsError) as caught:
                await onboard.enqueue(Onboard(ORG_A))
            assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    await assert_nothing_written(jobs)


# --------------------------------------------------------------------------- enqueue_as


async def test_enqueue_as_fills_the_tenant_from_the_actors_org_and_queues(
    jobs: Jobs, autojump_clock: Any
) -> None:
    got = await untenanted.enqueue_as(actor(ORG_B), Onboard("x"))
    same = await onboard.enqueue_as(actor(ORG_A), Onboard(ORG_A))
    await trio.sleep(1)  # nothing runs inline, and nothing runs without a worker
    assert ran == []
    for result, org in ((got, ORG_B), (same, ORG_A)):
        view = await jobs.show(result.id)
        assert view.tenant_id == org
        assert view.state == "ready"
        assert view.attempts == 0


async def test_enqueue_as_refuses_a_non_actor(jobs: Jobs) -> None:
    with pytest.raises(JobsError) as caught:
        await onboard.enqueue_as("user-1", Onboard(ORG_A))  # type: ignore[arg-type]
    assert caught.value.code == ErrorCode.X_INVARIANT
    await assert_nothing_written(jobs)


# --------------------------------------------------------------------------- no facade


async def test_no_facade_is_x_config_invalid() -> None:
    for call in (
        lambda: onboard.enqueue(Onboard(ORG_A)),
        lambda: onboard.enqueue_many([Onboard(ORG_A)]),
        lambda: onboard.enqueue_as(actor(ORG_A), Onboard(ORG_A)),
        lambda: publish_event("paid", {"id": 1}),
    ):
        with pytest.raises(JobsError) as caught:
            await call()
        assert caught.value.code == ErrorCode.X_CONFIG_INVALID
        assert "open_jobs" in caught.value.message
    with pytest.raises(JobsError) as caught:
        current_jobs()
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


async def test_the_facade_is_ambient_only_inside_open_jobs() -> None:
    async with open_jobs(memory_driver(), jobs=ALL) as facade:
        assert current_jobs() is facade
        got = await onboard.enqueue(Onboard(ORG_A))
        assert (await facade.show(got.id)).state == "ready"
    with pytest.raises(JobsError) as caught:
        await onboard.enqueue(Onboard(ORG_A))
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


async def test_an_exception_in_open_jobs_propagates_unchanged() -> None:
    boom = _Rollback("from the body")
    with pytest.raises(_Rollback) as caught:
        async with open_jobs(memory_driver(), jobs=ALL):
            raise boom
    assert caught.value is boom


# --------------------------------------------------------------------------- transactions


class _Rollback(Exception):
    pass


async def test_a_committed_transaction_makes_its_rows_visible(jobs: Jobs) -> None:
    async with jobs.transaction():
        got = await onboard.enqueue(Onboard(ORG_A))
        assert UUID_RE.fullmatch(got.id)  # the ids exist before the commit
        with pytest.raises(JobsError) as caught:
            await jobs.show(got.id)  # ... the row does not
        assert caught.value.code == ErrorCode.X_JOB_NOT_FOUND
        assert await queued(jobs) == 0
    view = await jobs.show(got.id)
    assert (view.id, view.run_id, view.state) == (got.id, got.run_id, "ready")


async def test_a_rolled_back_transaction_leaves_no_job_and_the_exception_unchanged(
    jobs: Jobs,
) -> None:
    boom = _Rollback("the business write failed")
    answered: list[Any] = []

    async def work() -> None:
        answered.append(await onboard.enqueue(Onboard(ORG_A)))

    with pytest.raises(_Rollback) as caught:
        await in_transaction(jobs, work, boom)
    [got] = answered
    assert caught.value is boom
    assert not isinstance(caught.value, BaseExceptionGroup)
    with pytest.raises(JobsError) as missing:
        await jobs.show(got.id)
    assert missing.value.code == ErrorCode.X_JOB_NOT_FOUND
    await assert_nothing_written(jobs)
    # the job never existed: its key is free
    again = await onboard.enqueue(Onboard(ORG_A))
    assert again.deduped is False
    assert again.id != got.id


async def test_a_jobs_error_raised_in_a_transaction_propagates_unchanged(jobs: Jobs) -> None:
    async def work() -> None:
        async with jobs.transaction():
            await onboard.enqueue(Onboard(ORG_A))
            await onboard.enqueue(Onboard(ORG_B), tenant_id=ORG_A)  # refused

    with pytest.raises(JobsError) as caught:
        await work()
    assert caught.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
    assert type(caught.value) is JobsError
    await assert_nothing_written(jobs)


async def test_a_cancelled_transaction_rolls_back(jobs: Jobs, autojump_clock: Any) -> None:
    with trio.move_on_after(1) as scope:
        async with jobs.transaction():
            await onboard.enqueue(Onboard(ORG_A))
            await trio.sleep_forever()
    assert scope.cancelled_caught
    await assert_nothing_written(jobs)


async def test_a_nested_transaction_joins_the_outer_one(jobs: Jobs) -> None:
    joined: list[bool] = []

    async def work() -> None:
        outer = _ambient.tx_var.get()
        async with jobs.transaction() as inner:
            joined.append(inner is outer)
            await onboard.enqueue(Onboard(ORG_A))

    with pytest.raises(_Rollback):
        await in_transaction(jobs, work, _Rollback())
    assert joined == [True]
    await assert_nothing_written(jobs)


async def test_a_dedupe_inside_a_transaction_answers_the_staged_row(jobs: Jobs) -> None:
    async with jobs.transaction():
        first = await onboard.enqueue(Onboard(ORG_A, note="first"))
        second = await onboard.enqueue(Onboard(ORG_A, note="second"))
        assert second.deduped is True
        assert second.id == first.id
    assert len(await rows(jobs)) == 1


async def test_a_staged_row_never_answers_an_enqueue_outside_its_transaction(
    jobs: Jobs, autojump_clock: Any
) -> None:
    outside: list[Any] = []
    go = trio.Event()
    done = trio.Event()

    async def other_request() -> None:  # started before the transaction: not in it
        await go.wait()
        outside.append(await onboard.enqueue(Onboard(ORG_A, note="outside")))
        done.set()

    async def staged_then_outside() -> None:
        await onboard.enqueue(Onboard(ORG_A, note="staged"))
        go.set()
        with trio.move_on_after(1):
            await done.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_request)
        with pytest.raises(_Rollback):
            await in_transaction(jobs, staged_then_outside, _Rollback())
        await done.wait()
    [got] = outside
    view = await jobs.show(got.id)  # the job the outside caller was told about exists
    assert view.payload["note"] == "outside"


async def test_publish_event_in_a_rolled_back_transaction_is_not_delivered(jobs: Jobs) -> None:
    events = jobs.driver.events
    before_commit: list[Any] = []

    async def work() -> None:
        await publish_event("invoice.paid", {"invoice": "inv-1"})
        before_commit.extend((await events.poll("invoice.paid", 0.0))[0])

    with pytest.raises(_Rollback):
        await in_transaction(jobs, work, _Rollback())
    assert before_commit == []  # not before the commit
    assert (await events.poll("invoice.paid", 0.0))[0] == []
    async with jobs.transaction():
        await publish_event("invoice.paid", {"invoice": "inv-2"})
    delivered, _now = await events.poll("invoice.paid", 0.0)
    assert [e.payload for e in delivered] == [{"invoice": "inv-2"}]


# --------------------------------------------------------------------------- set_job_driver


async def test_set_job_driver_swaps_the_driver_with_zero_job_code_change(
    autojump_clock: Any,
) -> None:
    ran.clear()
    first, second = memory_driver(), memory_driver()
    async with open_jobs(first, jobs=ALL) as jobs:
        before = await onboard.enqueue(Onboard(ORG_A))
        set_job_driver(second)
        after = await onboard.enqueue(Onboard(ORG_B))
        assert jobs.driver is second
        assert [r.id for r in (await second.introspect.list(_all())).rows] == [after.id]  # type: ignore[union-attr]
        assert [r.id for r in (await first.introspect.list(_all())).rows] == [before.id]  # type: ignore[union-attr]
        await Worker(jobs).run_until_quiet()
        assert (await jobs.show(after.id)).state == "done"
        assert ran == [after.id]
    assert first.closed
    assert second.closed  # open_jobs closes the driver it swapped to


async def test_set_job_driver_is_seen_by_every_facade_call_at_once(jobs: Jobs) -> None:
    old = jobs.driver
    new = memory_driver()
    set_job_driver(new)
    assert await queued(jobs) == 0
    async with jobs.transaction():
        got = await onboard.enqueue(Onboard(ORG_A))
    assert (await jobs.show(got.id)).state == "ready"
    assert jobs.driver is new
    assert await old.stats() == []  # type: ignore[attr-defined]


async def test_set_job_driver_then_stats_reads_the_new_driver(jobs: Jobs) -> None:
    await onboard.enqueue(Onboard(ORG_A))
    set_job_driver(memory_driver())
    assert await queued(jobs) == 0
    assert await rows(jobs) == []


async def test_set_job_driver_outside_open_jobs_sets_its_default() -> None:
    assert facade_mod._default_driver == []
    with pytest.raises(JobsError) as caught:
        async with open_jobs(jobs=ALL):
            pytest.fail("open_jobs opened without a driver")
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    driver = memory_driver()
    try:
        set_job_driver(driver)
        async with open_jobs(jobs=ALL) as jobs:
            assert jobs.driver is driver
            await onboard.enqueue(Onboard(ORG_A))
        assert len(driver._rows) == 1
    finally:
        facade_mod._default_driver.clear()


@pytest.mark.parametrize(
    "bad", [None, "memory", object(), MemoryDriver], ids=["None", "str", "object", "class"]
)
async def test_set_job_driver_refuses_a_non_driver(bad: Any) -> None:
    with pytest.raises(JobsError) as caught:
        set_job_driver(bad)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    assert facade_mod._default_driver == []


def _all() -> Any:
    from trio_jobs.drivers import ListFilter

    return ListFilter(limit=200)


# --------------------------------------------------------------------------- wrong input


@pytest.mark.parametrize(
    "value",
    [
        Onboard(org_id=7),  # type: ignore[arg-type]  # attrs does not check; the round trip does
        {"org_id": 7},
        {"org": ORG_A},
        {"org_id": ORG_A, "extra": 1},
        None,
        ORG_A,
        [ORG_A],
    ],
    ids=repr,
)
async def test_a_wrong_typed_input_is_x_job_input_invalid_with_nothing_queued(
    jobs: Jobs, value: Any
) -> None:
    with pytest.raises(JobsError) as caught:
        await untenanted.enqueue(value)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    with pytest.raises(JobsError) as caught:
        await untenanted.enqueue_many([Onboard(ORG_A), value])
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    await assert_nothing_written(jobs)


async def test_a_dict_input_is_structured_into_the_declared_class(jobs: Jobs) -> None:
    got = await onboard.enqueue({"org_id": ORG_A})  # type: ignore[arg-type]
    view = await jobs.show(got.id)
    assert view.payload == {"org_id": ORG_A, "note": ""}
    assert view.tenant_id == ORG_A


# --------------------------------------------------------------------------- JSON-native inputs


@job(name="texted", input=str, idempotency_key=lambda s: f"s:{s[:10]}")
async def texted(ctx: JobContext[str]) -> None:
    return None


@job(name="flagged", input=bool, idempotency_key=lambda b: f"b:{b}")
async def flagged(ctx: JobContext[bool]) -> None:
    return None


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, True, 1.0, "1"], ids=repr)
async def test_an_int_input_out_of_json_range_or_of_another_type_is_refused_whole(
    value: Any,
) -> None:
    # The batch path takes an exact int without parsing it: the range of a JSON
    # int (what orjson writes) and the declared type still refuse the whole call.
    async with open_jobs(memory_driver(), jobs=[counted]) as facade:
        with pytest.raises(JobsError) as caught:
            await counted.enqueue_many([1, value])
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        await assert_nothing_written(facade)


async def test_int_inputs_at_the_json_range_edges_are_queued_as_themselves() -> None:
    async with open_jobs(memory_driver(), jobs=[counted]) as facade:
        got = await counted.enqueue_many([2**64 - 1, -(2**63), 0])
        assert [(await facade.show(g.id)).payload for g in got] == [2**64 - 1, -(2**63), 0]


async def test_a_str_input_still_has_its_encoding_and_size_checked() -> None:
    async with open_jobs(memory_driver(), jobs=[texted, flagged]) as facade:
        with pytest.raises(JobsError) as caught:
            await texted.enqueue_many(["ok", "\ud800"])  # a lone surrogate has no UTF-8 form
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        with pytest.raises(JobsError) as caught:
            await texted.enqueue_many(["ok", "x" * (1024 * 1024 + 1)])
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        await assert_nothing_written(facade)
        got = await texted.enqueue_many(["é", "ok"])
        assert [(await facade.show(g.id)).payload for g in got] == ["é", "ok"]
        with pytest.raises(JobsError) as caught:
            await flagged.enqueue_many([True, 1])
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        got = await flagged.enqueue_many([True, False])
        assert [(await facade.show(g.id)).payload for g in got] == [True, False]


async def test_a_batch_has_distinct_uuid4_ids_and_run_ids() -> None:
    async with open_jobs(memory_driver(), jobs=[counted]):
        got = await counted.enqueue_many(range(2000))
    ids = [g.id for g in got] + [g.run_id for g in got]
    assert len(set(ids)) == 4000
    for value in ids:
        parsed = uuid.UUID(value)
        assert str(parsed) == value
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 1000])
def test_an_unseeded_batch_of_ids_is_canonical_uuid4_either_side_of_the_columnwise_layout(
    n: int,
) -> None:
    from trio_jobs._time import UuidSource

    ids = UuidSource().new_ids(n)
    assert len(ids) == n
    assert len(set(ids)) == n
    # The first 28 bits count up by one, the next 4 are their check digit
    # (tests/unit/test_enqueue_one.py); the rest is random.
    first = int(ids[0][:7], 16)
    assert [int(value[:7], 16) for value in ids] == [(first + k) % 2**28 for k in range(n)]
    # The check digit: the first eight digits weighted 1, 3, 1, ... from the
    # eighth back sum to 0 mod 16.
    for value in ids:
        weighted = sum((1 if (7 - i) % 2 == 0 else 3) * int(c, 16) for i, c in enumerate(value[:8]))
        assert weighted % 16 == 0, value
    if n >= 64:
        for position in range(9, 36):
            if position not in (13, 14, 18, 19, 23):
                assert len({value[position] for value in ids}) > 4, position
    for value in ids:
        parsed = uuid.UUID(value)
        assert str(parsed) == value
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


async def test_a_seeded_id_source_gives_a_batch_the_ids_it_gives_one_by_one() -> None:
    from trio_jobs._time import UuidSource

    async with open_jobs(memory_driver(), jobs=[counted], ids=UuidSource(11)):
        batch = await counted.enqueue_many([1, 2, 3])
    async with open_jobs(memory_driver(), jobs=[counted], ids=UuidSource(11)):
        single = [await counted.enqueue(i) for i in (1, 2, 3)]
    assert [(g.id, g.run_id) for g in batch] == [(g.id, g.run_id) for g in single]
