"""The transactional outbox (spec: "Transactional outbox by default"): the app's
PostgreSQL records the enqueues, a relay moves them onto a queue elsewhere.

The queue here is the memory driver (and, for the republish rule, the
PostgreSQL driver in another schema); the outbox store is a real server.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import pytest
import trio

from trio_jobs import JobContext, Jobs, job, memory_driver, open_jobs, publish_event
from trio_jobs.drivers import EnqueueRequest, EnqueueResult
from trio_jobs.drivers.memory import MemoryDriver
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.errors import ErrorCode, JobsError
from trio_jobs.outbox import PostgresOutbox, Relay, postgres_outbox

from .conftest import FakeClock, sql

pytestmark = pytest.mark.postgres

SECRET = "s3cr3t-payload-value"


@attrs.frozen
class Note:
    key: str
    secret: str = SECRET


@job(input=Note, tenant="none", idempotency_key=lambda i: f"note:{i.key}")
async def note(ctx: JobContext[Note]) -> None:
    return None


class RecordingDriver(MemoryDriver):
    """The memory driver, recording every enqueue_many it answers, and failing on
    request: on the row named ``poison`` (a refusal) or on everything (down)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.published: list[str] = []
        self.poison: str | None = None
        self.down = False

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        ids = [r.id for r in requests]
        self.calls.append(ids)
        if self.down:
            raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the broker is down")
        if self.poison is not None and self.poison in ids:
            raise JobsError(ErrorCode.X_INVARIANT, "the broker refused a row")
        out = await super().enqueue_many(requests)
        self.published.extend(ids)
        return out


@attrs.define
class World:
    jobs: Jobs
    queue: RecordingDriver
    store: PostgresOutbox
    clock: FakeClock
    dsn: str
    schema: str

    def pending(self) -> int:
        q = "SELECT count(*) FROM trio_jobs_outbox WHERE published_at IS NULL"
        return int(sql(self.dsn, self.schema, q)[0][0])  # type: ignore[call-overload]


@pytest.fixture
async def world(pg_dsn: str, pg_schema: str, clock: FakeClock) -> AsyncIterator[World]:
    queue = RecordingDriver()
    store = postgres_outbox(pg_dsn, schema=pg_schema, clock=clock)
    async with open_jobs(queue, jobs=[note], outbox=store) as jobs:
        yield World(jobs, queue, store, clock, pg_dsn, pg_schema)


async def stage(w: World, keys: Sequence[str]) -> list[str]:
    async with w.jobs.transaction():
        out = await note.enqueue_many([Note(k) for k in keys])
    return [e.id for e in out]


async def eventually(check: Any) -> None:
    """Poll ``check`` every millisecond (real time; the caller bounds the wait)."""
    while True:
        if check():
            return
        await trio.sleep(0.001)


def count_statements(store: PostgresOutbox) -> list[str]:
    seen: list[str] = []
    db = store._pg.db
    original = db.fetch

    async def fetch(statement: str, params: Any = None) -> Any:
        seen.append(statement.split("\n")[0])
        return await original(statement, params)

    db.fetch = fetch  # type: ignore[method-assign]
    return seen


# --------------------------------------------------------------------------- commit is the enqueue


async def test_a_rolled_back_transaction_stages_nothing_and_a_committed_one_stages_every_row(
    world: World,
) -> None:
    sql(world.dsn, world.schema, "CREATE TABLE posts (id int PRIMARY KEY)")

    async def handler_that_fails() -> None:
        async with world.jobs.transaction() as tx:
            await tx.execute("INSERT INTO posts VALUES (1)")
            await note.enqueue(Note("ghost"))
            raise RuntimeError("the handler failed")

    with pytest.raises(RuntimeError):
        await handler_that_fails()
    assert world.pending() == 0
    async with world.jobs.transaction() as tx:
        await tx.execute("INSERT INTO posts VALUES (2)")
        staged = await note.enqueue(Note("kept"))
    assert world.pending() == 1
    assert world.queue.calls == []  # nothing reached the queue yet: the relay moves it
    assert await Relay(world.jobs).relay_once() == 1
    view = await world.jobs.show(staged.id)  # published under the id it was staged with
    assert (view.id, view.run_id, view.idempotency_key) == (staged.id, staged.run_id, "note:kept")
    assert sql(world.dsn, world.schema, "SELECT id FROM posts") == [(2,)]


async def test_outside_a_transaction_an_enqueue_goes_straight_to_the_queue(world: World) -> None:
    await note.enqueue(Note("direct"))
    assert world.pending() == 0
    assert len(world.queue.published) == 1


async def test_inputs_sharing_a_key_in_one_transaction_stage_one_row(world: World) -> None:
    async with world.jobs.transaction():
        first = await note.enqueue(Note("same"))
        again = await note.enqueue_many([Note("same"), Note("other")])
    assert not first.deduped
    assert again[0].deduped
    assert again[0].id == first.id
    assert world.pending() == 2


# --------------------------------------------------------------------------- the pass


async def test_a_pass_is_three_statements_claim_enqueue_many_mark_published_many(
    world: World,
) -> None:
    ids = await stage(world, [f"k{i}" for i in range(500)])
    seen = count_statements(world.store)
    assert await Relay(world.jobs).relay_once() == 500
    assert [s for s in seen] == [
        "WITH n AS (SELECT trio_jobs_now(%(now)s) AS now),",  # outbox_claim
        "UPDATE trio_jobs_outbox o SET published_at = n.now, lease_until = NULL",  # mark many
    ]
    assert world.queue.calls == [ids]  # ONE enqueue_many, in staging order
    assert world.pending() == 0


async def test_the_default_batch_is_500_and_a_full_batch_is_followed_at_once(
    world: World,
) -> None:
    await stage(world, [f"k{i}" for i in range(1_200)])
    relay = Relay(world.jobs)
    assert relay.batch_size == 500
    assert [await relay.relay_once() for _ in range(4)] == [500, 500, 200, 0]
    assert [len(c) for c in world.queue.calls] == [500, 500, 200]
    assert len(world.queue._rows) == 1_200


async def test_a_failing_batch_falls_back_to_the_row_loop_up_to_the_poison_row(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await stage(world, [f"k{i}" for i in range(10)])
    world.queue.poison = ids[4]
    relay = Relay(world.jobs)
    caplog.set_level(logging.DEBUG, logger="trio_jobs")
    assert await relay.relay_once() == 4
    # the batch call, then the row loop: one call per row, in order, up to the poison row
    assert world.queue.calls == [ids, *([i] for i in ids[:5])]
    assert world.queue.published == ids[:4]
    failed = [
        r for r in caplog.records if getattr(r, "event", None) == "jobs.outbox.publish-failed"
    ]
    assert len(failed) == 1
    assert failed[0].row_id == ids[4]  # type: ignore[attr-defined]
    assert failed[0].code == "X_INVARIANT"  # type: ignore[attr-defined]
    assert all(SECRET not in str(r.__dict__) for r in caplog.records)
    rows = sql(
        world.dsn,
        world.schema,
        "SELECT id::text, attempts, lease_until IS NOT NULL, last_error FROM trio_jobs_outbox "
        "WHERE published_at IS NULL ORDER BY seq",
    )
    assert rows[0] == (ids[4], 1, True, "X_INVARIANT")  # held back, with what failed
    assert all(r[1:] == (0, False, None) for r in rows[1:])  # released, claim uncounted
    assert relay.stats().fallbacks == 1
    assert relay.stats().poison == 1
    # The rows after it are not blocked by it; it is tried again once its hold ends.
    assert await relay.relay_once() == 5
    assert world.queue.published == ids[:4] + ids[5:]
    world.queue.poison = None
    world.clock.advance(60)
    assert await relay.relay_once() == 1
    assert world.pending() == 0


async def test_a_row_this_version_cannot_read_is_one_poison_row(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    before = await stage(world, ["a"])
    junk = str(uuid.uuid4())
    sql(
        world.dsn,
        world.schema,
        "INSERT INTO trio_jobs_outbox (id, request, queue, staged_at) "
        'VALUES (%s, \'{"kind": "job", "secret": "s3cr3t"}\', \'default\', 0)',
        (junk,),
    )
    after = await stage(world, ["b"])
    caplog.set_level(logging.ERROR, logger="trio_jobs")
    relay = Relay(world.jobs)
    assert await relay.relay_once() == 1  # up to the unreadable row
    assert await relay.relay_once() == 1  # the row after it is not blocked
    assert world.queue.published == before + after
    (failed,) = [
        r for r in caplog.records if getattr(r, "event", None) == "jobs.outbox.publish-failed"
    ]
    assert failed.row_id == junk  # type: ignore[attr-defined]
    assert failed.code == "X_INVARIANT"  # type: ignore[attr-defined]
    assert "s3cr3t" not in str(failed.__dict__)
    assert world.pending() == 1


async def test_a_driver_that_is_down_releases_the_whole_batch_in_order(world: World) -> None:
    ids = await stage(world, [f"k{i}" for i in range(5)])
    world.queue.down = True
    relay = Relay(world.jobs)
    assert await relay.relay_once() == 0
    assert world.pending() == 5
    world.queue.down = False
    assert await relay.relay_once() == 5  # nothing was held back: the next pass takes all
    assert world.queue.published == ids


@pytest.mark.parametrize("queue_kind", ["memory", "postgres"])
async def test_a_batch_republished_after_a_crash_before_its_mark_adds_no_row(
    pg_dsn: str, pg_schema: str, clock: FakeClock, queue_kind: str, request: pytest.FixtureRequest
) -> None:
    if queue_kind == "memory":
        queue: Any = memory_driver()
    else:
        other = request.getfixturevalue("other_schema")
        queue = postgres_driver(pg_dsn, schema=other)
    store = postgres_outbox(pg_dsn, schema=pg_schema, clock=clock)
    async with open_jobs(queue, jobs=[note], outbox=store) as jobs:
        async with jobs.transaction():
            staged = await note.enqueue_many([Note(f"k{i}") for i in range(5)])
        relay = Relay(jobs)
        original = store._mark_many

        async def crash(ids: Sequence[str]) -> None:
            raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the relay died before its mark")

        store._mark_many = crash  # type: ignore[method-assign]
        with pytest.raises(JobsError):
            await relay.relay_once()
        store._mark_many = original  # type: ignore[method-assign]
        assert await relay.relay_once() == 0  # still leased by the dead pass
        clock.advance(31)  # the lease (30 s) lapses
        assert await relay.relay_once() == 5
        page = await jobs.list(limit=50)
        assert sorted(v.id for v in page.rows) == sorted(e.id for e in staged)
        assert len(page.rows) == 5
        out = await queue.enqueue_many(
            [
                EnqueueRequest(
                    id=e.id,
                    run_id=e.run_id,
                    name=note.name,
                    queue="default",
                    payload={"key": "fresh-key-same-id"},
                    idempotency_key="fresh-key-same-id",
                    max_attempts=3,
                )
                for e in staged[:1]
            ]
        )
        assert out[0].deduped
        assert out[0].id == staged[0].id


@pytest.fixture
def other_schema(pg_dsn: str) -> Any:
    import psycopg

    name = f"tj_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


async def test_a_delay_counts_from_the_staging_commit(world: World) -> None:
    async with world.jobs.transaction():
        staged = await note.enqueue(Note("later"), delay="60s")
    world.clock.advance(20)  # the relay publishes 20 s after the commit
    await Relay(world.jobs).relay_once()
    row = world.queue._rows[staged.id]
    assert row.run_at - row.created_at == pytest.approx(40.0, abs=0.5)


async def test_an_event_published_in_the_transaction_is_staged_and_relayed_in_order(
    world: World,
) -> None:
    async with world.jobs.transaction():
        await note.enqueue(Note("a"))
        await publish_event("order.paid", {"order": 1})
        await note.enqueue(Note("b"))
    assert world.pending() == 3
    assert await Relay(world.jobs).relay_once() == 3
    found, _now = await world.queue.events.poll("order.paid", 0.0)
    assert [e.payload for e in found] == [{"order": 1}]
    assert len(world.queue.calls) == 2  # the job runs either side of the event


async def test_published_rows_are_purged_after_the_retention_and_pending_rows_never(
    world: World,
) -> None:
    await stage(world, ["a", "b"])
    relay = Relay(world.jobs, published_retention="1h")
    await relay.relay_once()
    await stage(world, ["c"])  # staged, never published
    assert await relay.purge() == 0
    world.clock.advance(3_601)
    assert await relay.purge() == 2
    assert world.pending() == 1
    total = sql(world.dsn, world.schema, "SELECT count(*) FROM trio_jobs_outbox")
    assert total == [(1,)]


# --------------------------------------------------------------------------- idling and the wake


async def test_the_idle_ceiling_is_2s_and_5s_once_the_wake_is_proven(world: World) -> None:
    relay = Relay(world.jobs)
    assert relay.interval == 0.2
    wake = world.store.wake
    assert wake is not None
    wake.live = False
    assert relay.idle_poll_max == 2.0
    wake.live = True
    assert relay.idle_poll_max == 5.0
    assert Relay(world.jobs, idle_poll_max="30s").idle_poll_max == 30.0


async def test_an_idle_relay_is_woken_by_a_commit_from_another_connection(
    pg_dsn: str, pg_schema: str
) -> None:
    """Another process's staging commit (its own store, so no local fire) wakes
    the relay through the transactional pg_notify, long before its poll."""
    queue = RecordingDriver()
    async with open_jobs(
        queue, jobs=[note], outbox=postgres_outbox(pg_dsn, schema=pg_schema)
    ) as jobs:
        relay = Relay(jobs, idle_poll_max="30s")
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            wake = jobs.outbox.wake  # type: ignore[union-attr]
            with trio.fail_after(10):
                await eventually(lambda: wake.live)
            await trio.sleep(1.0)  # idle: the poll has backed off past 1 s
            other = postgres_outbox(pg_dsn, schema=pg_schema)
            latencies = []
            async with open_jobs(memory_driver(), jobs=[note], outbox=other) as app:
                for i in range(3):
                    async with app.transaction():
                        await note.enqueue(Note(f"woken-{i}"))
                    committed = trio.current_time()
                    with trio.fail_after(1.0):
                        await eventually(lambda i=i: len(queue.published) > i)
                    latencies.append(trio.current_time() - committed)
                    await trio.sleep(0.4)
            nursery.cancel_scope.cancel()
    print("relay pickup latencies (s):", [round(x, 4) for x in latencies])
    assert max(latencies) < 1.0, latencies
    assert relay.stats().passes < 40  # it idled; it did not spin


# --------------------------------------------------------------------------- step.transaction


async def test_a_transaction_step_is_refused_when_the_queue_is_elsewhere(world: World) -> None:
    from trio_jobs import Retry, Worker

    calls: list[str] = []

    @job(
        input=Note,
        tenant="none",
        idempotency_key=lambda i: f"txstep:{i.key}",
        retry=Retry(attempts=1),
        name="outbox.txstep",
    )
    async def txstep(ctx: JobContext[Note]) -> None:
        async def fn(tx: Any) -> None:
            calls.append("ran")

        await ctx.step.transaction("t", fn)

    world.jobs.register(txstep)
    enq = await txstep.enqueue(Note("a"))  # outside a transaction: straight to the queue
    await Worker(world.jobs, queues=["default"]).run_until_quiet()
    view = await world.jobs.show(enq.id)
    assert view.state == "dead"
    assert view.error_code == ErrorCode.X_NOT_IMPLEMENTED
    assert "outbox" in (view.last_error or "")
    assert calls == []  # refused before fn ran
    assert view.steps == []
