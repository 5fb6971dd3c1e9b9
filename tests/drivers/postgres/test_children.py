"""Child jobs on PostgreSQL: the child's settle wakes its parent in the settle's
own statement (trigger, 0018), cancellation flows to live children, and
``show`` names the tree."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_jobs import MAX_ENQUEUE_BATCH, ErrorCode, JobContext, Retry, Worker, job, open_jobs
from trio_jobs.drivers.postgres import postgres_driver

from .conftest import sql

pytestmark = pytest.mark.postgres

resumed: list[Any] = []


@job(input=int, idempotency_key=lambda n: str(n))
async def square(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


@job(input=int, idempotency_key=lambda n: str(n), retry=Retry(attempts=1))
async def boom(ctx: JobContext[int]) -> int:
    raise ValueError("no")


@job(input=int, idempotency_key=lambda n: str(n))
async def sleeper(ctx: JobContext[int]) -> int:
    await ctx.step.sleep("1h")
    return 1


@job(input=str, idempotency_key=lambda k: k, event_poll="1h", retry=Retry(attempts=1))
async def parent(ctx: JobContext[str]) -> Any:
    if ctx.input == "fail":
        return await ctx.step.invoke("one", boom, 1)
    if ctx.input == "hang":
        return await ctx.step.gather("all", [(sleeper, n) for n in range(3)])
    one = await ctx.step.invoke("one", square, 3)
    many = await ctx.step.gather("many", [(square, n) for n in range(50)])
    resumed.append(ctx.input)
    return {"one": one, "many": sum(many)}


async def _until(jobs: Any, job_id: str, *states: str) -> Any:
    with trio.fail_after(30):
        while True:
            view = await jobs.show(job_id)
            if view.state in states:
                return view
            await trio.sleep(0.05)


async def test_a_parent_gathers_its_children_and_shows_the_tree(
    pg_dsn: str, pg_schema: str
) -> None:
    resumed.clear()
    jobs_list = [parent, square, boom, sleeper]
    async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema), jobs=jobs_list) as jobs:
        enq = await parent.enqueue("ok")
        failing = await parent.enqueue("fail")
        worker = Worker(jobs, queues=["default"], concurrency={"default": 4}, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            view = await _until(jobs, enq.id, "done", "dead")
            bad = await _until(jobs, failing.id, "done", "dead")
            await worker.drain()
        assert view.state == "done"
        assert view.result == {"one": 9, "many": sum(n * n for n in range(50))}
        assert resumed == ["ok"]
        assert len(view.children) == 51
        assert view.parent_id is None
        child = await jobs.show(view.children[0])
        assert child.parent_id == enq.id
        assert child.children == ()
        assert bad.state == "dead"
        assert bad.error_code == ErrorCode.X_CHILD_FAILED
    pending = sql(
        pg_dsn,
        pg_schema,
        "SELECT count(*) FROM trio_jobs_child_waits WHERE parent_id = %s",
        (enq.id,),
    )
    assert pending == [(0,)]  # every wait counted down to zero and gone


async def test_cancelling_a_parent_cancels_its_live_children(pg_dsn: str, pg_schema: str) -> None:
    jobs_list = [parent, square, boom, sleeper]
    async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema), jobs=jobs_list) as jobs:
        enq = await parent.enqueue("hang")
        worker = Worker(jobs, queues=["default"], concurrency={"default": 4}, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await _until(jobs, enq.id, "suspended")
            view = await jobs.show(enq.id)
            while len(view.children) < 3:
                view = await jobs.show(enq.id)
            for c in view.children:
                await _until(jobs, c, "delayed")
            await jobs.cancel(enq.id)
            await worker.drain()
        states = [(await jobs.show(c)).state for c in view.children]
    assert states == ["cancelled"] * 3


@job(input=int, idempotency_key=lambda n: f"noop:{n}", name="pgchild.noop")
async def noop(ctx: JobContext[int]) -> int:
    return ctx.input


@job(input=int, idempotency_key=lambda n: f"fan:{n}", name="pgchild.fan", event_poll="1h")
async def fan(ctx: JobContext[int]) -> int:
    got = await ctx.step.gather("all", [(noop, i) for i in range(ctx.input)])
    assert got == list(range(ctx.input))
    return len(got)


async def test_a_gather_of_a_thousand_children_resumes_once_with_their_results(
    pg_dsn: str, pg_schema: str
) -> None:
    async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema), jobs=[fan, noop]) as jobs:
        enq = await fan.enqueue(1_000)
        worker = Worker(jobs, concurrency={"default": 50}, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            view = await _until(jobs, enq.id, "done", "dead")
            await worker.drain()
        assert view.state == "done", view.last_error
        assert view.result == 1_000
        assert len(view.children) == 1_000
        # one waiting record, then completed: the children were enqueued once
        (step,) = [s for s in view.steps if s.name == "all"]
        assert step.status == "completed"
    rows = sql(
        pg_dsn,
        pg_schema,
        "SELECT count(*), count(DISTINCT idempotency_key) FROM trio_jobs_jobs WHERE parent_id = %s",
        (enq.id,),
    )
    assert rows == [(1_000, 1_000)]


@job(input=int, idempotency_key=lambda n: f"stranger:{n}", name="pgchild.stranger")
async def stranger(ctx: JobContext[int]) -> int:
    return 1


@job(input=str, idempotency_key=lambda k: k, name="pgchild.bad", retry=Retry(attempts=1))
async def bad_parent(ctx: JobContext[str]) -> Any:
    if ctx.input == "stranger":
        return await ctx.step.invoke("one", stranger, 1)
    if ctx.input == "too-many":
        return await ctx.step.gather("all", [(noop, n) for n in range(MAX_ENQUEUE_BATCH + 1)])
    if ctx.input == "not-a-pair":
        return await ctx.step.gather("all", [noop])  # type: ignore[list-item]
    return await ctx.step.invoke("one", noop, 1, timeout="soon")


@pytest.mark.parametrize(
    ("case", "code", "named"),
    [
        ("stranger", ErrorCode.X_JOB_DECLARATION_INVALID, "pgchild.stranger"),
        ("too-many", ErrorCode.X_JOB_ENQUEUE_BATCH_TOO_LARGE, "at most"),
        ("not-a-pair", ErrorCode.X_JOB_DECLARATION_INVALID, "(job, input) pairs"),
        ("bad-timeout", ErrorCode.X_JOB_DECLARATION_INVALID, "timeout"),
    ],
)
async def test_bad_child_calls_are_refused_and_nothing_is_written(
    pg_dsn: str, pg_schema: str, case: str, code: str, named: str
) -> None:
    async with open_jobs(
        postgres_driver(pg_dsn, schema=pg_schema), jobs=[bad_parent, noop]
    ) as jobs:
        enq = await bad_parent.enqueue(case)
        worker = Worker(jobs, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            view = await _until(jobs, enq.id, "dead")
            await worker.drain()
    assert view.error_code == code
    assert named in (view.last_error or "")
    assert view.children == ()
    assert [s.name for s in view.steps] == []  # no step record
    rows = sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs WHERE parent_id IS NOT NULL")
    waits = sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_child_waits")
    assert (rows, waits) == ([(0,)], [(0,)])


@job(input=str, idempotency_key=lambda k: k, name="pgchild.impatient", retry=Retry(attempts=1))
async def impatient(ctx: JobContext[str]) -> Any:
    return await ctx.step.invoke("slow", sleeper, 7, timeout="1s")


async def test_a_child_that_outlasts_the_timeout_raises_child_timeout_and_keeps_running(
    pg_dsn: str, pg_schema: str
) -> None:
    async with open_jobs(
        postgres_driver(pg_dsn, schema=pg_schema), jobs=[impatient, sleeper]
    ) as jobs:
        enq = await impatient.enqueue("t")
        worker = Worker(jobs, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            view = await _until(jobs, enq.id, "dead")
            await worker.drain()
        child = await jobs.show(view.children[0])
    assert view.error_code == ErrorCode.X_CHILD_TIMEOUT
    assert child.id in (view.last_error or "")
    assert child.state == "delayed"  # asleep in its own step, still live
    assert child.parent_id == enq.id


@job(input=int, idempotency_key=lambda n: str(n), name="pgcp.kid", retry=Retry(attempts=5))
async def cp_kid(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


@job(input=int, idempotency_key=lambda n: str(n), name="pgcp.parent", retry=Retry(attempts=5))
async def cp_parent(ctx: JobContext[int]) -> int:
    one = await ctx.step.invoke("one", cp_kid, ctx.input)
    many = await ctx.step.gather("many", [(cp_kid, i) for i in range(3)])
    return int(one + sum(many))


async def test_crash_proof_walks_the_child_boundaries_on_postgres(pg_dsn: str) -> None:
    """Killed before a child's enqueue, after it, before the parent resumes and
    after its record, on PostgreSQL (the gate's throwaway schema): every run
    ends as the clean one (state, result, every step's stored output). That
    no child is enqueued twice is the simulation's check (the children
    scenario and its planted bug)."""
    from trio_jobs.testing._crash import _crash_proof
    from trio_jobs.testing._pg_ground import open_postgres_ground

    async with open_postgres_ground(pg_dsn) as ground:
        report = await _crash_proof(
            cp_parent, 3, observe=None, reset=None, jobs=[cp_kid], ground=ground
        )
    for step in ("one", "many"):
        for boundary in ("before-step", "after-enqueue", "before-resume", "after-record"):
            assert f"{boundary}:{step}" in report.points, (boundary, step, report.points)
    assert report.reference[0] == 14
