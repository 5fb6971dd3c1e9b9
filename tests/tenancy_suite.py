"""Tenancy under an acting actor (issue 15), over the facade, on any driver.

Spec, "the declared tenant is checked at enqueue": under an ambient actor of an
org, a row of another org is ``X_JOB_TENANT_MISMATCH`` before anything is queued,
whichever way its tenant was named (the input's declared tenant, ``tenant_id=``,
``enqueue_as``'s actor); ``cross_tenant(reason)`` by an actor holding
``tenancy:cross`` is the one escape. The operator surface under such an actor sees
and touches only that org's rows; the CLI and the dashboard act as operators (no
actor) and see every org.

A driver's test module subclasses :class:`EnqueueUnderAnActor` (every driver)
and :class:`OperatorUnderAnActor` (drivers with an operator surface) and provides
an async ``jobs`` fixture: a facade opened with :data:`JOBS`.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from trio_jobs import (
    Actor,
    ErrorCode,
    JobContext,
    Jobs,
    JobsError,
    acting_as,
    cross_tenant,
    job,
)

ORG_A = "org-a"
ORG_B = "org-b"


@attrs.frozen
class Onboard:
    org_id: str


@job(
    name="tenancy.onboard",
    input=Onboard,
    tenant=lambda i: i.org_id,
    idempotency_key=lambda i: f"onboard:{i.org_id}",
)
async def onboard(ctx: JobContext[Onboard]) -> None:
    pass


@job(
    name="tenancy.untenanted",
    input=Onboard,
    tenant="none",
    idempotency_key=lambda i: f"untenanted:{i.org_id}",
)
async def untenanted(ctx: JobContext[Onboard]) -> None:
    pass


JOBS = [onboard, untenanted]


def bob() -> Actor:
    """An actor of org B, with no cross-tenant permission."""
    return Actor("bob", org_id=ORG_B)


def support() -> Actor:
    """An actor of org B who may cross tenants."""
    return Actor("sue", org_id=ORG_B, permissions=frozenset({"tenancy:cross"}))


async def rows_queued(jobs: Jobs) -> int:
    """Every row, whatever its state (as an operator: no actor)."""
    with acting_as(None):
        stats = await jobs.stats()
    return sum(
        s.ready + s.delayed + s.running + s.suspended + s.done + s.failed + s.dead + s.cancelled
        for s in stats
    )


def assert_code(caught: pytest.ExceptionInfo[JobsError], code: ErrorCode) -> None:
    assert caught.value.code == code, caught.value


class EnqueueUnderAnActor:
    async def test_a_tenant_id_of_another_org_is_a_mismatch(self, jobs: Jobs) -> None:
        with acting_as(bob()):
            with pytest.raises(JobsError) as caught:
                await untenanted.enqueue(Onboard("x"), tenant_id=ORG_A)
            assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
            assert ORG_A not in caught.value.message  # no tenant ids in messages
            with pytest.raises(JobsError) as caught:
                await untenanted.enqueue_many([Onboard("x"), Onboard("y")], tenant_id=ORG_A)
            assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
        assert await rows_queued(jobs) == 0

    async def test_enqueue_as_an_actor_of_another_org_is_a_mismatch(self, jobs: Jobs) -> None:
        with acting_as(bob()):
            with pytest.raises(JobsError) as caught:
                await untenanted.enqueue_as(Actor("al", org_id=ORG_A), Onboard("x"))
            assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
            # an org-less actor passed explicitly does not carry org A's input past bob
            with pytest.raises(JobsError) as caught:
                await onboard.enqueue_as(Actor("system"), Onboard(ORG_A))
            assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
        assert await rows_queued(jobs) == 0

    async def test_the_actors_own_org_and_no_tenant_are_accepted(self, jobs: Jobs) -> None:
        with acting_as(bob()):
            own = await untenanted.enqueue(Onboard("x"), tenant_id=ORG_B)
            declared = await onboard.enqueue(Onboard(ORG_B))
            # tenant="none" and no tenant_id=: never compared, the row has no tenant
            none = await untenanted.enqueue(Onboard("y"))
            as_own = await untenanted.enqueue_as(Actor("bea", org_id=ORG_B), Onboard("z"))
        assert await rows_queued(jobs) == 4
        if jobs.driver.introspect is not None:
            with acting_as(None):
                tenants = [(await jobs.show(e.id)).tenant_id for e in (own, declared, none, as_own)]
            assert tenants == [ORG_B, ORG_B, None, ORG_B]

    async def test_cross_tenant_admits_another_org(self, jobs: Jobs) -> None:
        with acting_as(support()):
            with cross_tenant("support: replay org A's onboarding"):
                got = await untenanted.enqueue(Onboard("x"), tenant_id=ORG_A)
                await untenanted.enqueue_as(Actor("al", org_id=ORG_A), Onboard("y"))
            with pytest.raises(JobsError) as caught:  # outside the block the check is back
                await untenanted.enqueue(Onboard("z"), tenant_id=ORG_A)
            assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
        assert await rows_queued(jobs) == 2
        if jobs.driver.introspect is not None:
            assert (await jobs.show(got.id)).tenant_id == ORG_A

    async def test_cross_tenant_never_admits_a_contradicted_declared_tenant(
        self, jobs: Jobs
    ) -> None:
        with acting_as(support()), cross_tenant("support"):
            with pytest.raises(JobsError) as caught:
                await onboard.enqueue(Onboard(ORG_A), tenant_id=ORG_B)
            assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
        assert await rows_queued(jobs) == 0

    async def test_an_actor_with_no_org_is_not_confined(self, jobs: Jobs) -> None:
        with acting_as(Actor("ops")):
            await untenanted.enqueue(Onboard("x"), tenant_id=ORG_A)
            await onboard.enqueue(Onboard(ORG_B))
        assert await rows_queued(jobs) == 2


@attrs.frozen
class Seeded:
    a: list[str]
    b: list[str]


async def seed(jobs: Jobs) -> Seeded:
    """Two delayed rows of each org, enqueued by an operator (no actor)."""
    a = [
        (await untenanted.enqueue(Onboard(f"a{i}"), tenant_id=ORG_A, delay=3600)).id for i in (1, 2)
    ]
    b = [
        (await untenanted.enqueue(Onboard(f"b{i}"), tenant_id=ORG_B, delay=3600)).id for i in (1, 2)
    ]
    return Seeded(a, b)


class OperatorUnderAnActor:
    async def test_show_of_another_orgs_job_is_not_found(self, jobs: Jobs) -> None:
        rows = await seed(jobs)
        with acting_as(bob()):
            assert (await jobs.show(rows.b[0])).tenant_id == ORG_B
            with pytest.raises(JobsError) as caught:
                await jobs.show(rows.a[0])
            assert_code(caught, ErrorCode.X_JOB_NOT_FOUND)
            # the same answer as for an id no row has: existence is not confirmed
            with pytest.raises(JobsError) as unknown:
                await jobs.show("00000000-0000-4000-8000-000000000000")
            assert unknown.value.message == caught.value.message

    async def test_list_sees_only_the_actors_org(self, jobs: Jobs) -> None:
        rows = await seed(jobs)
        with acting_as(bob()):
            assert {v.id for v in (await jobs.list()).rows} == set(rows.b)
            assert {v.id for v in (await jobs.list(tenant_id=ORG_B)).rows} == set(rows.b)
            assert (await jobs.list(state="delayed", name="tenancy.untenanted")).rows
            with pytest.raises(JobsError) as caught:
                await jobs.list(tenant_id=ORG_A)
            assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
        assert {v.id for v in (await jobs.list()).rows} == set(rows.a + rows.b)

    async def test_single_row_calls_on_another_orgs_job_change_nothing(self, jobs: Jobs) -> None:
        rows = await seed(jobs)
        target = rows.a[0]
        calls: list[tuple[str, Any]] = [
            ("cancel", lambda: jobs.cancel(target, reason="bob was here")),
            ("remove", lambda: jobs.remove(target)),
            ("promote", lambda: jobs.promote(target)),
            ("requeue", lambda: jobs.requeue(target)),
            ("retry", lambda: jobs.retry(target)),
            ("resolve_step", lambda: jobs.resolve_step(target, "charge", ran=False)),
        ]
        with acting_as(bob()):
            for label, call in calls:
                with pytest.raises(JobsError) as caught:
                    await call()
                assert caught.value.code == ErrorCode.X_JOB_NOT_FOUND, label
        view = await jobs.show(target)
        assert (view.state, view.tenant_id) == ("delayed", ORG_A)

    async def test_single_row_calls_on_the_actors_own_job_work(self, jobs: Jobs) -> None:
        rows = await seed(jobs)
        with acting_as(bob()):
            assert (await jobs.promote(rows.b[0])).state == "ready"
            assert (await jobs.cancel(rows.b[1], reason="no longer needed")).state == "cancelled"
            await jobs.remove(rows.b[1])
        assert {v.id for v in (await jobs.list()).rows} == {*rows.a, rows.b[0]}

    async def test_bulk_calls_touch_only_the_actors_org(self, jobs: Jobs) -> None:
        rows = await seed(jobs)
        await jobs.cancel(rows.a[1])  # as an operator: one cancelled row in each org
        await jobs.cancel(rows.b[1])
        with acting_as(bob()):
            assert tuple(await jobs.promote_many(state="delayed")) == (1, 0)
            assert tuple(await jobs.requeue_many(state="cancelled")) == (1, 0)
            assert tuple(await jobs.remove_many(state="ready")) == (2, 0)
            for call in (jobs.promote_many, jobs.remove_many, jobs.requeue_many):
                with pytest.raises(JobsError) as caught:
                    await call(state="cancelled", tenant_id=ORG_A)
                assert_code(caught, ErrorCode.X_JOB_TENANT_MISMATCH)
        left = {(v.id, v.state) for v in (await jobs.list()).rows}
        assert left == {(rows.a[0], "delayed"), (rows.a[1], "cancelled")}

    async def test_calls_spanning_every_org_are_forbidden(self, jobs: Jobs) -> None:
        await seed(jobs)
        with acting_as(bob()):
            for label, call in [
                ("stats", jobs.stats),
                ("workers", jobs.workers),
                ("counters", jobs.counters),
                ("pause_queue", lambda: jobs.pause_queue("default")),
                ("resume_queue", lambda: jobs.resume_queue("default")),
            ]:
                with pytest.raises(JobsError) as caught:
                    await call()
                assert caught.value.code == ErrorCode.X_FORBIDDEN, label
            assert await jobs.paused_queues() == []  # names only: no org's rows
        assert await jobs.paused_queues() == []

    async def test_cross_tenant_and_no_actor_see_every_org(self, jobs: Jobs) -> None:
        rows = await seed(jobs)
        everyone = set(rows.a + rows.b)
        with acting_as(support()), cross_tenant("support: org A asked for help"):
            assert {v.id for v in (await jobs.list()).rows} == everyone
            assert (await jobs.show(rows.a[0])).tenant_id == ORG_A
            assert {v.id for v in (await jobs.list(tenant_id=ORG_A)).rows} == set(rows.a)
            assert await jobs.stats()
        with acting_as(bob()), acting_as(None):  # the operator's view (CLI, dashboard)
            assert {v.id for v in (await jobs.list()).rows} == everyone
            await jobs.pause_queue("default")
            await jobs.resume_queue("default")
        with acting_as(Actor("ops")):  # an actor with no org is not confined either
            assert {v.id for v in (await jobs.list()).rows} == everyone
