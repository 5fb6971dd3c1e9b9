"""The PostgreSQL driver's own promises, beyond the conformance suite: one
statement per batch, dedupe under concurrency, commit is the enqueue, fencing,
group commit, the wake."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
import trio

from trio_jobs.drivers import (
    AckOptions,
    ClaimOptions,
    Fence,
    HeartbeatRequest,
    NackOptions,
    StepRecord,
)
from trio_jobs.drivers.postgres import PostgresDriver, postgres_driver
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import FakeClock, fill, req, sql

pytestmark = pytest.mark.postgres


def _count_statements(driver: PostgresDriver) -> list[str]:
    """Record every statement the driver sends (wraps the driver's own Database)."""
    seen: list[str] = []
    db = driver.db
    original = db.fetch

    async def fetch(statement: str, params: Any = None) -> Any:
        seen.append(statement)
        return await original(statement, params)

    db.fetch = fetch  # type: ignore[method-assign]
    original_text = db.fetch_text

    async def fetch_text(statement: str, params: Any) -> Any:
        seen.append(statement)
        return await original_text(statement, params)

    db.fetch_text = fetch_text  # type: ignore[method-assign]
    return seen


async def test_a_single_enqueue_is_one_statement_and_a_held_key_asks_who_holds_it(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    seen = _count_statements(driver)
    first = await driver.enqueue_many([req("solo", payload={"n": 1})])
    assert len(seen) == 1
    assert seen[0].lstrip().startswith("INSERT INTO trio_jobs_jobs")
    assert not first[0].deduped
    # the key is held: the insert answers nothing, enqueue_many names the holder
    again = await driver.enqueue_many([req("solo", payload={"n": 2})])
    assert len(seen) == 3
    assert again[0].deduped
    assert (again[0].id, again[0].run_id) == (first[0].id, first[0].run_id)
    rows = sql(pg_dsn, pg_schema, "SELECT payload::text, state FROM trio_jobs_jobs")
    assert rows == [('{"n":1}', "ready")]


async def test_twenty_concurrent_enqueues_of_one_key_make_one_row(
    pg_dsn: str, pg_schema: str
) -> None:
    drivers = [postgres_driver(pg_dsn, schema=pg_schema) for _ in range(2)]
    for d in drivers:
        await d.open()
    results: list[Any] = []
    try:

        async def one(i: int) -> None:
            out = await drivers[i % 2].enqueue_many([req("the-one-key", payload={"i": i})])
            results.append(out[0])

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(one, i)
    finally:
        for d in drivers:
            await d.close()
    assert len(results) == 20
    assert len({r.id for r in results}) == 1
    assert sum(not r.deduped for r in results) == 1
    rows = sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs")
    assert rows == [(1,)]


async def test_enqueue_many_of_a_thousand_is_one_statement(driver: PostgresDriver) -> None:
    seen = _count_statements(driver)
    out = await driver.enqueue_many([req(f"k{i}") for i in range(1000)])
    assert len(out) == 1000
    assert len(seen) == 1
    out = await driver.enqueue_many([req(f"m{i}") for i in range(2500)])
    assert len(out) == 2500
    assert len(seen) == 4  # one per 1,000


async def test_a_batch_stores_each_rows_own_columns_shared_or_varying(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    # enqueue_many sends a column the batch shares once and a varying one per
    # row: either way each row holds its own request's values.
    shared = [req(f"s{i}", priority=2, tenant_id="t", actor={"id": "u"}) for i in range(3)]
    mixed = [
        req("v0", name="a", queue="q1", priority=1, tenant_id=None, sensitive=True, delay=60.0),
        req(
            "v1",
            name="b",
            queue="q2",
            priority=5,
            tenant_id="t2",
            concurrency_key="c",
            actor={"id": "u", "n": 1},
            trace_context={"traceparent": "x"},
            max_attempts=7,
        ),
        req("v2", name="a", queue="q1", priority=1, run_at=1.0, actor={"id": "u", "n": True}),
    ]
    for batch in (shared, mixed):
        await driver.enqueue_many(batch)
        for r in batch:
            row = sql(
                pg_dsn,
                pg_schema,
                "SELECT name, queue, tenant_id, concurrency_key, max_attempts, priority, "
                "sensitive, actor, trace_context, state, payload FROM trio_jobs_jobs WHERE id = %s",
                (r.id,),
            )
            assert row == [
                (
                    r.name,
                    r.queue,
                    r.tenant_id,
                    r.concurrency_key,
                    r.max_attempts,
                    r.priority,
                    r.sensitive,
                    r.actor,
                    r.trace_context,
                    "delayed" if r.delay else "ready",
                    r.payload,
                )
            ]


async def test_a_full_batch_dedupes_within_itself_and_against_a_live_row(
    driver: PostgresDriver,
) -> None:
    from trio_jobs.drivers import MAX_ENQUEUE_BATCH

    live = (await driver.enqueue_many([req("k7")]))[0]
    batch = [req(f"k{i % (MAX_ENQUEUE_BATCH // 2)}") for i in range(MAX_ENQUEUE_BATCH)]
    out = await driver.enqueue_many(batch)
    assert len(out) == MAX_ENQUEUE_BATCH
    half = MAX_ENQUEUE_BATCH // 2
    for i, got in enumerate(out):
        if i % half == 7:
            assert (got.id, got.deduped) == (live.id, True)
        elif i < half:
            assert (got.id, got.run_id, got.deduped) == (batch[i].id, batch[i].run_id, False)
        else:
            assert (got.id, got.run_id, got.deduped) == (
                out[i - half].id,
                out[i - half].run_id,
                True,
            )


async def test_a_rolled_back_transaction_leaves_no_job(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    sql(pg_dsn, pg_schema, "CREATE TABLE posts (id int PRIMARY KEY)")

    class Boom(Exception):
        pass

    async def body() -> None:
        async with driver.transaction() as tx:
            await tx.execute("INSERT INTO posts VALUES (%s)", (1,))
            out = await tx.enqueue_many([req("ghost")])
            await tx.publish("ghost-event", {"x": 1})
            # visible inside the transaction...
            assert await tx.execute("SELECT count(*) FROM trio_jobs_jobs") == [(1,)]
            assert out[0].deduped is False
            raise Boom

    with pytest.raises(Boom):
        await body()
    # ...and never existed outside it
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs") == [(0,)]
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM posts") == [(0,)]
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_events") == [(0,)]
    # a key staged in a rolled-back transaction is free
    assert not (await driver.enqueue_many([req("ghost")]))[0].deduped


async def test_a_committed_transaction_is_the_enqueue(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    sql(pg_dsn, pg_schema, "CREATE TABLE posts (id int PRIMARY KEY)")
    async with driver.transaction() as tx:
        await tx.execute("INSERT INTO posts VALUES (%(id)s)", {"id": 7})
        first = await tx.enqueue_many([req("notify-7"), req("notify-7")])
        assert [r.deduped for r in first] == [False, True]
        # not visible to others before the commit
        assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs") == [(0,)]
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs") == [(1,)]
    got = await driver.claim(ClaimOptions("w", {"default": 5}, 30.0))
    assert [j.id for j in got.jobs] == [first[0].id]


async def test_settles_are_fenced_on_worker_and_claim(
    clocked: PostgresDriver, clock: FakeClock
) -> None:
    d = clocked
    await d.enqueue_many([req("f")])
    job = (await d.claim(ClaimOptions("w1", {"default": 1}, 30.0))).jobs[0]
    wrong_worker = Fence("w2", job.fence.claim)
    wrong_claim = Fence("w1", job.fence.claim + 1000)
    for fence in (wrong_worker, wrong_claim):
        assert not await d.ack(job.id, AckOptions(fence=fence))
        assert not await d.nack(job.id, NackOptions(fence=fence, state="ready"))
        assert not await d.steps.put(job.id, fence, StepRecord("s", "completed", 1, 1))
        assert await d.heartbeat([HeartbeatRequest(job.id, fence)], 30.0) == ["lost"]
    clock.advance(29.0)
    assert await d.heartbeat([HeartbeatRequest(job.id, job.fence)], 30.0) == ["ok"]
    clock.advance(29.0)  # alive only thanks to the heartbeat
    assert await d.ack(job.id, AckOptions(fence=job.fence, duration=1.5))
    view = await d.introspect.show(job.id)  # type: ignore[union-attr]
    assert (view.state, view.worker_id) == ("done", None)


async def test_the_claim_buries_a_final_lapse_and_counts_it(
    clocked: PostgresDriver, clock: FakeClock
) -> None:
    d = clocked
    await d.enqueue_many([req("once", name="fragile", max_attempts=1)])
    job = (await d.claim(ClaimOptions("w1", {"default": 1}, 30.0))).jobs[0]
    leases = d.leases
    assert leases is not None
    assert (await leases.acquire("fragile", 1, job.id, job.fence, 30.0)).slot == 0
    clock.advance(31.0)
    result = await d.claim(ClaimOptions("w2", {"other-queue": 1}, 30.0))
    assert [(e.id, e.state, e.error_code) for e in result.exhausted] == [
        (job.id, "dead", "X_JOB_LEASE_LOST")
    ]
    assert "1 of 1" in result.exhausted[0].last_error
    assert await leases.held("fragile") == 0  # released by the reaping claim
    rows = await d.introspect.counters("fragile", 0.0)  # type: ignore[union-attr]
    assert sum(r.dead for r in rows) == 1


async def test_a_claim_with_no_lapsed_lease_is_one_small_statement_and_a_lapse_still_reaps(
    clocked: PostgresDriver, clock: FakeClock
) -> None:
    d = clocked
    from trio_jobs.drivers.postgres._sql import query

    await d.enqueue_many([req("first", priority=0), req("second", priority=5)])
    seen = _count_statements(d)
    first = (await d.claim(ClaimOptions("w1", {"default": 1}, 30.0))).jobs
    # nothing had lapsed: the statement without the reap, alone
    assert seen == [query("claim_ready")]
    assert [j.idempotency_key for j in first] == ["first"]
    clock.advance(31.0)
    seen.clear()
    # the first row's lease lapsed: the small statement takes nothing and the
    # reaping claim runs in the same call, taking the lapsed row back ahead of
    # the waiting one (due at its lapse, and of a better priority)
    again = await d.claim(ClaimOptions("w2", {"default": 1}, 30.0))
    assert seen == [query("claim_ready"), query("claim")]
    assert [(j.id, j.attempt, j.lapsed) for j in again.jobs] == [(first[0].id, 2, True)]
    assert not again.exhausted
    # and the old holder's ack is refused (fenced), the new holder's lands
    assert not await d.ack(first[0].id, AckOptions(fence=first[0].fence))
    assert await d.ack(first[0].id, AckOptions(fence=again.jobs[0].fence))
    seen.clear()
    second = (await d.claim(ClaimOptions("w2", {"default": 5}, 30.0))).jobs
    assert seen == [query("claim_ready")]
    assert [j.idempotency_key for j in second] == ["second"]


async def test_step_puts_from_many_slots_share_commits(driver: PostgresDriver) -> None:
    d = driver
    await d.enqueue_many([req(f"s{i}") for i in range(20)])
    jobs = (await d.claim(ClaimOptions("w", {"default": 20}, 30.0))).jobs
    before = d._step_writer.flushes
    landed: list[bool] = []

    async def slot(job: Any) -> None:
        for n in range(3):
            landed.append(
                await d.steps.put(
                    job.id, job.fence, StepRecord(f"step{n}", "completed", n, 1, {"n": n})
                )
            )

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(slot, job)
    assert landed == [True] * 60
    flushes = d._step_writer.flushes - before
    assert flushes < 60 / 2, f"60 records took {flushes} commits"
    for job in jobs:
        assert [r.name for r in await d.steps.load(job.id)] == ["step0", "step1", "step2"]


async def test_a_step_put_outlives_a_cancel_of_its_caller(driver: PostgresDriver) -> None:
    """The store declares its put shielded (the step write takes no scope of its
    own): a caller cancelled mid-write still hears the answer, and the record
    is stored; the cancel is raised at the caller's next checkpoint."""
    d = driver
    assert d.steps.shielded
    await d.enqueue_many([req("cancelled")])
    job = (await d.claim(ClaimOptions("w", {"default": 1}, 30.0))).jobs[0]
    answers: list[object] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        answers.append(
            await d.steps.put(job.id, job.fence, StepRecord("a", "completed", 1, 1, {"k": 1}))
        )
        await trio.lowlevel.checkpoint()
        answers.append("unreachable")
    assert scope.cancelled_caught
    assert answers == [True]
    assert [(r.name, r.output) for r in await d.steps.load(job.id)] == [("a", {"k": 1})]


async def test_a_step_write_past_the_writers_budget_is_unavailable(driver: PostgresDriver) -> None:
    """A step statement that hangs (here: the job row locked by another
    session) answers its writes within the step writer's budget, as unavailable;
    the writer goes on, and a later write lands."""
    from trio_jobs._context import WRITE_BUDGET
    from trio_jobs.drivers.postgres._driver import STEP_WRITE_BUDGET

    assert STEP_WRITE_BUDGET == WRITE_BUDGET
    d = driver
    await d.enqueue_many([req("hung")])
    job = (await d.claim(ClaimOptions("w", {"default": 1}, 30.0))).jobs[0]
    d._step_writer.budget = 0.5
    async with d.db.transaction() as tx:
        await tx.execute(
            "SELECT 1 FROM trio_jobs_jobs WHERE id = %(id)s FOR UPDATE", {"id": job.id}
        )
        with pytest.raises(JobsError) as caught:
            await d.steps.put(job.id, job.fence, StepRecord("a", "completed", 1, 1, 1))
    assert caught.value.code == ErrorCode.X_DRIVER_UNAVAILABLE
    assert "write budget" in str(caught.value)
    d._step_writer.budget = STEP_WRITE_BUDGET
    assert await d.steps.put(job.id, job.fence, StepRecord("b", "completed", 2, 1, 2))
    assert "b" in [r.name for r in await d.steps.load(job.id)]


async def test_the_claim_carries_recorded_steps(driver: PostgresDriver) -> None:
    d = driver
    await d.enqueue_many([req("carry")])
    job = (await d.claim(ClaimOptions("w", {"default": 1}, 30.0))).jobs[0]
    assert job.steps == []
    await d.steps.put(
        job.id, job.fence, StepRecord("a", "completed", 1, 1, output={"z": 1, "a": 2})
    )
    await d.nack(job.id, NackOptions(fence=job.fence, state="ready", counted=False))
    again = (await d.claim(ClaimOptions("w", {"default": 1}, 30.0))).jobs[0]
    assert again.steps is not None
    assert [(s.name, s.output) for s in again.steps] == [("a", {"z": 1, "a": 2})]
    assert list(again.steps[0].output) == ["z", "a"]  # key order kept (json, not jsonb)


async def test_an_enqueue_from_another_process_wakes_an_idle_waiter(
    pg_dsn: str, pg_schema: str
) -> None:
    worker = postgres_driver(pg_dsn, schema=pg_schema)
    app = postgres_driver(pg_dsn, schema=pg_schema)
    await worker.open()
    await app.open()
    try:
        wake = worker.wake
        assert wake is not None
        # the first wait starts the LISTEN session; the probe proves it
        assert not await wake.wait(["default"], 0.01)
        with trio.fail_after(5):
            while not wake.live:  # noqa: ASYNC110 — a bounded poll of a flag, in a test
                await trio.sleep(0.01)
        woke: list[bool] = []

        async def waiter() -> None:
            woke.append(await wake.wait(["default"], 5.0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(0.05)
            started = trio.current_time()
            await app.enqueue_many([req("wake-me")])  # another driver: only NOTIFY reaches it
        assert woke == [True]
        assert trio.current_time() - started < 1.0
        # another queue's notification does not wake this waiter
        assert not await wake.wait(["elsewhere"], 0.2)
    finally:
        await worker.close()
        await app.close()


async def test_notifications_are_throttled_per_queue(driver: PostgresDriver) -> None:
    for i in range(5):
        await driver.enqueue_many([req(f"t{i}")])
    # five enqueues within 250 ms: one notification
    assert list(driver._notified) == ["default"]
    allowed = driver._notify_allowed(["default", "other"])
    assert allowed == ["other"]


async def test_payloads_keep_their_json_text(driver: PostgresDriver) -> None:
    payload = {"z": 1, "a": {"y": [1, 2.5, None, "é"], "b": True}}
    await driver.enqueue_many([req("json", payload=payload)])
    job = (await driver.claim(ClaimOptions("w", {"default": 1}, 30.0))).jobs[0]
    assert job.payload == payload
    assert list(job.payload) == ["z", "a"]


async def test_the_database_clock_decides(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    await driver.enqueue_many([req("clock")])
    rows = sql(
        pg_dsn,
        pg_schema,
        "SELECT created_at, extract(epoch from clock_timestamp())::float8 FROM trio_jobs_jobs",
    )
    created, db_now = rows[0]
    assert isinstance(created, float)
    assert isinstance(db_now, float)
    assert 0 <= db_now - created < 5
    assert abs(driver.now() - db_now) < 5


def test_psycopg_is_real() -> None:
    assert psycopg.pq.version() >= 140000
    assert uuid.UUID(str(uuid.uuid4()))


def test_the_event_poll_backstop_is_fifteen_minutes() -> None:
    from trio_jobs.drivers.postgres import postgres_driver

    # A publish wakes its waiters in the same statement; the poll is only the backstop.
    assert postgres_driver("postgresql://unused@127.0.0.1/x").event_poll_default == 900.0


async def test_a_lease_deleted_under_another_search_path_still_wakes_its_waiter(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    """The wake trigger keeps its schema's search_path: a delete made from a
    session on another one (an operator's psql, a maintenance script) still wakes
    this schema's waiting run, and touches no other schema."""
    await driver.enqueue_many([req("holder"), req("waiter")])
    holder, waiter = (await driver.claim(ClaimOptions("w1", {"default": 2}, 30.0))).jobs
    leases = driver.leases
    assert leases is not None
    assert (await leases.acquire("acct", 1, holder.id, holder.fence, 30.0)).slot == 0
    assert (await leases.acquire("acct", 1, waiter.id, waiter.fence, 30.0)).slot is None
    assert await driver.nack(
        waiter.id,
        NackOptions(fence=waiter.fence, state="ready", counted=False, delay=300.0, busy_key="acct"),
    )
    assert (await driver.claim(ClaimOptions("w2", {"default": 5}, 30.0))).jobs == []
    with psycopg.connect(pg_dsn, autocommit=True, options="-c search_path=pg_catalog") as conn:
        conn.execute(f'DELETE FROM "{pg_schema}".trio_jobs_leases WHERE job_id = %s', (holder.id,))
    woken = (await driver.claim(ClaimOptions("w2", {"default": 5}, 30.0))).jobs
    assert [j.id for j in woken] == [waiter.id]


async def test_a_renewal_does_not_scan_the_finished_rows(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    # A heartbeat's cost must follow the rows a worker holds: its answer joined the
    # requests back to the renewed rows, which the planner made a nested loop,
    # quadratic in the batch (16 ms for 300 held rows: 89,700 rows removed by the
    # join filter). Neither that nor a scan of the table's finished rows.
    from trio_jobs.drivers.postgres._sql import query

    fill(pg_dsn, pg_schema, 100_000, state="done", name="old", queue="default")
    sql(pg_dsn, pg_schema, "ANALYZE trio_jobs_jobs")
    await driver.enqueue_many([req(f"h{i}") for i in range(300)])
    held = (await driver.claim(ClaimOptions("w1", {"default": 300}, 30.0))).jobs
    assert len(held) == 300
    params = {
        "now": None,
        "ids": [c.id for c in held],
        "worker_ids": [c.fence.worker_id for c in held],
        "claims": [c.fence.claim for c in held],
        "progress": [None] * len(held),
        "steps": [None] * len(held),
        "step_since": [None] * len(held),
        "visibility": 30.0,
    }
    with psycopg.connect(pg_dsn, autocommit=True, options=f"-c search_path={pg_schema}") as conn:
        conn.execute("BEGIN")
        plan = "\n".join(
            str(r[0]) for r in conn.execute("EXPLAIN ANALYZE " + query("heartbeat"), params)
        )
        conn.execute("ROLLBACK")
    assert "Seq Scan on trio_jobs_jobs" not in plan, plan
    assert "Rows Removed by Join Filter" not in plan, plan
    statuses = await driver.heartbeat([HeartbeatRequest(c.id, c.fence, None) for c in held], 30.0)
    assert statuses == ["ok"] * 300


def test_a_single_enqueues_parameters_are_built_in_the_statements_own_order() -> None:
    # The fast builder answers the list the by-name builder answers, for every
    # kind of value a request carries; and the statement still numbers its
    # parameters in the fast builder's order (else every enqueue takes the
    # by-name builder: still right, only slower).
    from trio_jobs.drivers import EnqueueRequest
    from trio_jobs.drivers.postgres._driver import _ONE_ORDER, _one_params, _one_values
    from trio_jobs.drivers.postgres._sql import positional

    assert positional("enqueue_one")[1] == _ONE_ORDER
    requests = [
        EnqueueRequest("i", "r", "n", "q", 7, "k", 3),
        EnqueueRequest("i", "r", "n", "q", -(2**63), "k", 3),
        EnqueueRequest("i", "r", "n", "q", 2**64 - 1, "k", 3),
        EnqueueRequest("i", "r", "n", "q", True, "k", 3),
        EnqueueRequest("i", "r", "n", "q", None, "k", 3),
        EnqueueRequest("i", "r", "n", "q", 1.5, "k", 3),
        EnqueueRequest("i", "r", "n", "q", "é", "k", 3),
        EnqueueRequest(
            "i",
            "r",
            "n",
            "q",
            {"a": [1, None, "x"]},
            "k",
            12,
            tenant_id="t",
            concurrency_key="c",
            priority=-4,
            run_at=1_900_000_000.25,
            delay=0.1,
            actor={"id": "u", "org_id": None, "permissions": []},
            trace_context={"traceparent": "00-ab-cd-01"},
            sensitive=True,
            parent_id="p",
            parent_wait="w",
        ),
    ]
    for r in requests:
        for now, notify in ((None, True), (1_800_000_000.5, False)):
            assert _one_values(r, now=now, channel="ch", notify=notify) == _one_params(
                r, _ONE_ORDER, now=now, channel="ch", notify=notify
            )
