"""``ctx.step.transaction(name, fn)``: a step whose effects commit with its record.

On the memory driver the transaction carries enqueues and ``publish_event``
(there is no SQL); tests/drivers/postgres/test_step_transaction.py covers the
app's own rows. The point proven here: what ``fn`` writes through the
transaction lands exactly once — a crash anywhere before the commit leaves
neither the effect nor the record, and a replay never calls ``fn`` again.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import pytest
import trio

from jobs_support import Item
from trio_jobs import ErrorCode, JobContext, JobsError, Retry, job
from trio_jobs.testing import crash_proof, open_harness

#: The follow-up jobs that ran, by token (a re-run of one adds nothing; a
#: second follow-up, enqueued by a re-run of the step, adds a token).
ran: set[str] = set()


@attrs.frozen
class Follow:
    token: str


@job(input=Follow, idempotency_key=lambda f: f.token, name="tx.follow_up")
async def follow_up(ctx: JobContext[Follow]) -> None:
    ran.add(ctx.input.token)


async def _enqueue_fresh(tx: Any) -> dict[str, str]:
    # A fresh key per execution: a re-run of this fn would enqueue a second job.
    token = uuid.uuid4().hex
    await follow_up.enqueue(Follow(token))
    return {"token": token}


@job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3), name="tx.atomic")
async def atomic(ctx: JobContext[Item]) -> str:
    out = await ctx.step.transaction("enqueue", _enqueue_fresh)
    return str(out["token"])


@job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3), name="tx.separate")
async def separate(ctx: JobContext[Item]) -> str:
    # The same fn as an ordinary step: its enqueue commits before the record.
    out = await ctx.step.run("enqueue", lambda: _enqueue_fresh(None))
    return str(out["token"])


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


async def test_the_effect_and_the_record_land_together(autojump_clock: Any) -> None:
    async with open_harness(jobs=[atomic, follow_up]) as h:
        trace = await h.run(atomic, Item("a"))
        await h.drain()
        assert trace.state == "done"
        assert trace.steps["enqueue"].status == "completed"
        assert trace.steps["enqueue"].executions == 1
        assert trace.result == trace.steps["enqueue"].output["token"]
    assert ran == {trace.result}


async def test_crash_proof_finds_no_double_in_a_transaction_step(autojump_clock: Any) -> None:
    report = await crash_proof(
        atomic, Item("a"), observe=lambda: len(ran), reset=ran.clear, jobs=[follow_up]
    )
    # The kill after fn returned is inside the transaction: it rolls back.
    assert "after-fn:enqueue" in report.points
    assert report.reference == 1


async def test_the_same_fn_as_an_ordinary_step_doubles_under_crash_proof(
    autojump_clock: Any,
) -> None:
    # The contrast that makes the test above meaningful.
    with pytest.raises(JobsError) as err:
        await crash_proof(
            separate, Item("a"), observe=lambda: len(ran), reset=ran.clear, jobs=[follow_up]
        )
    assert err.value.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert err.value.meta["boundary"] == "after-fn:enqueue"
    assert err.value.meta["got"] == 2


async def test_a_replay_answers_the_record_without_calling_fn(autojump_clock: Any) -> None:
    calls: list[int] = []

    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        retry=Retry(attempts=2, base="1s"),
        name="tx.replay",
    )
    async def replayed(ctx: JobContext[Item]) -> Any:
        async def fn(tx: Any) -> dict[str, int]:
            calls.append(ctx.attempt)
            return {"n": len(calls)}

        out = await ctx.step.transaction("t", fn)
        if ctx.attempt == 1:
            raise RuntimeError("fail after the step")
        return out

    async with open_harness(jobs=[replayed]) as h:
        trace = await h.run(replayed, Item("r"))
    assert trace.state == "done"
    assert trace.attempts == 2
    assert calls == [1]
    assert trace.result == {"n": 1}


async def test_an_exception_rolls_back_is_recorded_and_reraised(autojump_clock: Any) -> None:
    seen: list[BaseException] = []

    class Boom(Exception):
        pass

    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1), name="tx.boom")
    async def boom(ctx: JobContext[Item]) -> None:
        async def fn(tx: Any) -> None:
            await follow_up.enqueue(Follow("never"))
            raise Boom("no")

        try:
            await ctx.step.transaction("t", fn)
        except Boom as exc:
            seen.append(exc)
            raise

    async with open_harness(jobs=[boom, follow_up]) as h:
        trace = await h.run(boom, Item("b"))
        assert trace.state == "dead"
        assert trace.steps["t"].status == "failed"
        assert [type(e) for e in seen] == [Boom]
        # The enqueue inside the rolled-back transaction never existed.
        assert [r.name for r in h.driver._rows.values()] == ["tx.boom"]
    assert ran == set()


async def test_a_step_timeout_rolls_back(autojump_clock: Any) -> None:
    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        retry=Retry(attempts=1),
        step_timeout="1s",
        name="tx.slow",
    )
    async def slow(ctx: JobContext[Item]) -> None:
        async def fn(tx: Any) -> None:
            await follow_up.enqueue(Follow("slow"))
            await trio.sleep(5)

        await ctx.step.transaction("t", fn)

    async with open_harness(jobs=[slow, follow_up]) as h:
        trace = await h.run(slow, Item("s"))
        assert trace.state == "dead"
        assert trace.error_code == ErrorCode.X_JOB_TIMEOUT
        assert trace.steps["t"].status == "failed"
        assert sum(1 for r in h.driver._rows.values() if r.name == "tx.follow_up") == 0


async def test_bad_declarations_are_refused_before_anything_runs(autojump_clock: Any) -> None:
    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1), name="tx.bad")
    async def bad(ctx: JobContext[Item]) -> None:
        if ctx.input.key == "notcallable":
            await ctx.step.transaction("t", 42)  # type: ignore[arg-type]
        elif ctx.input.key == "compensate":
            await ctx.step.transaction("t", _enqueue_fresh, compensate=lambda out: None)
        else:
            await ctx.step.transaction("", _enqueue_fresh)

    async with open_harness(jobs=[bad, follow_up]) as h:
        for key in ("notcallable", "compensate", "noname"):
            trace = await h.run(bad, Item(key))
            assert trace.state == "dead", key
            assert trace.error_code == ErrorCode.X_JOB_DECLARATION_INVALID, key
            assert trace.steps == {}, key
    assert ran == set()


async def test_a_refused_fence_applies_nothing(autojump_clock: Any) -> None:
    # The memory transaction checks the fence at put_step and again at commit.
    from trio_jobs.drivers._protocol import ClaimOptions, Fence, StepRecord
    from trio_jobs.drivers.memory import MemoryDriver

    driver = MemoryDriver()
    from trio_jobs import open_jobs

    async with open_jobs(driver, jobs=[atomic, follow_up]):
        enq = await atomic.enqueue(Item("f"))
        claimed = await driver.claim(
            ClaimOptions(worker_id="w", queues={"default": 1}, visibility_timeout=30)
        )
        [row] = claimed.jobs
        assert row.id == enq.id
        record = StepRecord(name="t", status="completed", seq=1, executions=1, output=1)
        # A stale fence: refused at once.
        async with driver.transaction() as tx:
            assert not await tx.put_step(row.id, Fence("w", row.fence.claim + 1), record)

        # The right fence, but the lease lapses before the commit: nothing applies.
        async def lapses_before_commit() -> None:
            async with driver.transaction() as tx:
                assert await tx.put_step(row.id, row.fence, record)
                driver._rows[row.id].lease_expires_at = driver.now() - 1

        with pytest.raises(JobsError) as err:
            await lapses_before_commit()
        assert err.value.code == ErrorCode.X_JOB_LEASE_LOST
        assert await driver.steps.load(row.id) == []


async def test_a_drain_mid_transaction_rolls_back_and_records_nothing(autojump_clock: Any) -> None:
    # Spec: "A cancelled body writes nothing" — the transaction rethrows the abort.
    from jobs_support import jobs_on_memory, running_worker

    entered = trio.Event()

    @job(input=Item, idempotency_key=lambda i: i.key, name="tx.drained")
    async def drained(ctx: JobContext[Item]) -> None:
        async def fn(tx: Any) -> None:
            await follow_up.enqueue(Follow("drained"))
            entered.set()
            await trio.sleep_forever()

        await ctx.step.transaction("t", fn)

    async with jobs_on_memory([drained, follow_up]) as (jobs, driver):
        enq = await drained.enqueue(Item("d"))
        async with running_worker(jobs, queues=["default"]) as worker:
            await entered.wait()
            await worker.drain()
        view = await jobs.show(enq.id)
        assert view.state == "ready"  # handed back, the attempt given back
        assert view.attempts == 0
        assert view.steps == []
        assert [r.name for r in driver._rows.values()] == ["tx.drained"]
