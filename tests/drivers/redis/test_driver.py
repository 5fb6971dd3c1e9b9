"""What the Redis driver promises beyond the conformance suite: unavailability
fails at once and a worker rides it out, the key-schema version, the wake,
queue pauses, batches, transactions, counters, retention and the capabilities
it declares. Real server (``REDIS_URL``), one key prefix per test."""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import coredis
import pytest
import trio

from trio_jobs import Concurrency, JobContext, Worker, job, open_jobs, redis_driver
from trio_jobs.drivers import (
    AckOptions,
    ClaimOptions,
    EnqueueRequest,
    HeartbeatRequest,
    NackOptions,
)
from trio_jobs.drivers._protocol import StepMark
from trio_jobs.drivers.redis import SCHEMA_VERSION, RedisDriver
from trio_jobs.errors import JobsError

from ..busy_wait import check_a_busy_key_wakes_its_waiter, check_many_runs_queue_behind_few_keys
from .conftest import pytestmark as _skip_without_redis
from .conftest import req

pytestmark = _skip_without_redis


@asynccontextmanager
async def raw(url: str) -> AsyncIterator[coredis.Redis[str]]:
    client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
    async with client:
        yield client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- unavailability


async def test_open_against_a_closed_port_fails_at_once(redis_prefix: str) -> None:
    driver = redis_driver(f"redis://127.0.0.1:{_free_port()}/0", prefix=redis_prefix)
    started = time.monotonic()
    with pytest.raises(JobsError) as err:
        await driver.open()
    assert err.value.code == "X_DRIVER_UNAVAILABLE"
    assert time.monotonic() - started < 1.0
    assert "127.0.0.1" not in str(err.value)  # the class is named, not the server's text


class _Proxy:
    """A TCP relay in front of the real server that the test can take down
    (listener and every relayed connection) and bring back on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = _free_port()
        self._scope: trio.CancelScope | None = None

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await dst.aclose()

    async def _handle(self, client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except OSError:
            await client.aclose()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream)
            nursery.start_soon(self._pump, upstream, client)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started()

    def stop(self) -> None:
        assert self._scope is not None
        self._scope.cancel()


@attrs.frozen
class Item:
    key: str


ran: list[str] = []


@job(input=Item, tenant="none", idempotency_key=lambda i: f"item:{i.key}", name="redis.item")
async def item_job(ctx: JobContext[Item]) -> None:
    await ctx.step.run("note", lambda: ran.append(ctx.input.key))


async def test_while_redis_is_down_enqueue_fails_at_once_and_a_worker_retries(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran.clear()
    target_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = _Proxy(target_port)
    caplog.set_level(logging.WARNING, logger="trio_jobs")
    async with trio.open_nursery() as outer:
        await outer.start(proxy.run)
        driver = redis_driver(
            f"redis://127.0.0.1:{proxy.port}/0", prefix=redis_prefix, connect_timeout="500ms"
        )
        async with open_jobs(driver, jobs=[item_job]) as jobs:
            worker = Worker(jobs, poll_interval="50ms", idle_poll_max="200ms")
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await item_job.enqueue(Item("before"))
                with trio.fail_after(10):
                    while ran != ["before"]:  # noqa: ASYNC110 — bounded wait on the worker
                        await trio.sleep(0.02)

                proxy.stop()  # Redis goes away
                await trio.sleep(0.05)
                started = time.monotonic()
                with pytest.raises(JobsError) as err:
                    await item_job.enqueue(Item("during"))
                assert err.value.code == "X_DRIVER_UNAVAILABLE"
                assert time.monotonic() - started < 1.0, "an enqueue must fail at once"
                with trio.fail_after(10):
                    while sum("jobs.claim.failed" in r.message for r in caplog.records) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.05)

                await outer.start(proxy.run)  # ... and comes back on the same port
                with trio.fail_after(10):
                    while True:
                        try:
                            await item_job.enqueue(Item("after"))
                            break
                        except JobsError:
                            await trio.sleep(0.05)
                    while ran != ["before", "after"]:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                await worker.drain()
        proxy.stop()


# --------------------------------------------------------------------------- key schema


async def test_open_stores_the_key_schema_version(redis_url: str, redis_prefix: str) -> None:
    driver = redis_driver(redis_url, prefix=redis_prefix)
    await driver.open()
    await driver.close()
    async with raw(redis_url) as client:
        assert await client.get(f"{redis_prefix}:schema") == str(SCHEMA_VERSION)


async def test_a_schema_version_mismatch_refuses_to_open(redis_url: str, redis_prefix: str) -> None:
    async with raw(redis_url) as client:
        await client.set(f"{redis_prefix}:schema", str(SCHEMA_VERSION + 1))
    driver = redis_driver(redis_url, prefix=redis_prefix)
    with pytest.raises(JobsError) as err:
        await driver.open()
    assert err.value.code == "X_CONFIG_INVALID"
    message = str(err.value)
    assert redis_prefix in message
    assert "prefix=" in message  # it says what to do
    assert err.value.meta["stored"] == str(SCHEMA_VERSION + 1)
    with pytest.raises(JobsError) as err:
        await driver.enqueue_many([req("k")])
    assert err.value.code == "X_DRIVER_UNAVAILABLE"


async def test_a_bad_url_is_a_config_error() -> None:
    with pytest.raises(JobsError) as err:
        await redis_driver("http://nope:xyz/0").open()
    assert err.value.code in ("X_CONFIG_INVALID", "X_DRIVER_UNAVAILABLE")


async def test_scripts_are_loaded_again_after_a_flush(driver: RedisDriver) -> None:
    async with raw(driver.url) as client:
        await client.script_flush()
    out = await driver.enqueue_many([req("after-flush")])
    assert not out[0].deduped


# --------------------------------------------------------------------------- wake


async def test_an_idle_worker_in_another_process_is_woken_by_pubsub(
    redis_url: str, redis_prefix: str
) -> None:
    """Two drivers (two connection pools, as two processes have): the enqueue on
    one reaches the worker on the other through pub/sub, well inside the poll."""
    seen: list[float] = []

    @job(input=Item, tenant="none", idempotency_key=lambda i: i.key, name="redis.wake")
    async def wake_job(ctx: JobContext[Item]) -> None:
        seen.append(time.monotonic())

    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=[wake_job]) as jobs:
        worker = Worker(jobs, poll_interval="5s", idle_poll_max="10s")
        wake = jobs.driver.wake
        assert wake is not None
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(6):
                while not wake.live:  # noqa: ASYNC110 — the probe has to round-trip
                    await trio.sleep(0.01)
            await trio.sleep(0.2)  # the worker is idle, waiting up to 5 s
            other = redis_driver(redis_url, prefix=redis_prefix)
            async with open_jobs(other, jobs=[wake_job]):
                latencies = []
                for i in range(5):
                    sent = time.monotonic()
                    await wake_job.enqueue(Item(f"w{i}"))
                    with trio.fail_after(2):
                        while len(seen) <= i:  # noqa: ASYNC110
                            await trio.sleep(0.001)
                    latencies.append(seen[i] - sent)
                    await trio.sleep(0.05)
            await worker.drain()
    assert max(latencies) < 0.25, latencies  # the poll alone would take 5 s


async def test_wake_is_announced_by_the_script_itself(redis_url: str, driver: RedisDriver) -> None:
    async with raw(redis_url) as client:
        async with client.pubsub(channels=[driver.channel]) as sub:
            await driver.enqueue_many([req("a", queue="qa"), req("b", queue="qb", delay=60.0)])
            got = []
            with trio.move_on_after(2):
                async for message in sub:
                    if message["type"] == "message":
                        got.append(message["data"])
                        break
    assert got == ["qa"]  # the delayed row announces nothing


# --------------------------------------------------------------------------- pauses, batches


def _claim(queues: dict[str, int]) -> ClaimOptions:
    return ClaimOptions(worker_id="w", queues=queues, visibility_timeout=30.0)


async def test_a_paused_queue_is_not_claimed_and_enqueues_still_land(driver: RedisDriver) -> None:
    await driver.enqueue_many([req("a", queue="qa"), req("b", queue="qb")])
    await driver.pause_queue("qb")
    assert await driver.paused_queues() == ["qb"]
    got = await driver.claim(_claim({"qa": 5, "qb": 5}))
    assert [j.queue for j in got.jobs] == ["qa"]
    await driver.enqueue_many([req("c", queue="qb")])
    await driver.resume_queue("qb")
    got = await driver.claim(_claim({"qa": 5, "qb": 5}))
    assert sorted(j.queue for j in got.jobs) == ["qb", "qb"]


async def test_enqueue_many_is_one_script_call_per_thousand(
    driver: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = driver._script

    async def counting(name: str, args: Any) -> Any:
        calls.append(name)
        return await real(name, args)

    monkeypatch.setattr(driver, "_script", counting)
    reqs = [req(f"k{i}") for i in range(2500)]
    out = await driver.enqueue_many(reqs)
    assert calls == ["enqueue", "enqueue", "enqueue"]
    assert [o.id for o in out] == [r.id for r in reqs]


async def test_a_transaction_that_lost_a_key_race_applies_nothing(driver: RedisDriver) -> None:
    async def staged_then_raced() -> None:
        async with driver.transaction() as tx:
            out = await tx.enqueue_many([req("raced"), req("mine")])
            assert not any(o.deduped for o in out)
            await tx.publish("evt", {"n": 1})
            await driver.enqueue_many([req("raced")])  # outside the transaction

    with pytest.raises(JobsError) as err:
        await staged_then_raced()
    assert err.value.code == "X_INVARIANT"
    stats = await driver.stats()
    assert sum(s.ready for s in stats) == 1  # only the row enqueued outside
    found, _ = await driver.events.poll("evt", 0.0)
    assert found == []


async def test_transactions_run_no_sql(driver: RedisDriver) -> None:
    async with driver.transaction() as tx:
        with pytest.raises(JobsError) as err:
            await tx.execute("select 1")
    assert err.value.code == "X_NOT_IMPLEMENTED"


# --------------------------------------------------------------------------- counters, retention


async def test_settles_move_minute_counters(driver: RedisDriver) -> None:
    since = driver.now() - 60
    await driver.enqueue_many([req(f"c{i}", name="counted") for i in range(2)])
    a, b = (await driver.claim(_claim({"default": 2}))).jobs
    assert await driver.ack(a.id, AckOptions(fence=a.fence, duration=1.5))
    from trio_jobs.drivers import NackOptions

    assert await driver.nack(b.id, NackOptions(fence=b.fence, state="dead"))
    rows = await driver.counters("counted", since)
    assert sum(r.done for r in rows) == 1
    assert sum(r.dead for r in rows) == 1
    assert sum(r.duration for r in rows) == pytest.approx(1.5)
    # each row says which queue its job settled in (a dashboard without handles reads it)
    assert {r.queue for r in rows} == {"default"}


async def test_a_settled_row_expires_after_its_retention(redis_url: str, redis_prefix: str) -> None:
    driver = redis_driver(redis_url, prefix=redis_prefix, done_retention="1h")
    await driver.open()
    try:
        await driver.enqueue_many([req("r")])
        job_ = (await driver.claim(_claim({"default": 1}))).jobs[0]
        assert await driver.ack(job_.id, AckOptions(fence=job_.fence, result={"ok": True}))
        async with raw(redis_url) as client:
            ttl = await client.ttl(f"{redis_prefix}:job:{job_.id}")
        assert 3500 < ttl <= 3600
    finally:
        await driver.close()


# --------------------------------------------------------------------------- capabilities


async def test_capabilities_declared(driver: RedisDriver) -> None:
    assert driver.leases is not None
    assert driver.introspect is not None
    assert driver.wake is not None


async def test_the_operator_surface_answers_through_the_facade(
    redis_url: str, redis_prefix: str
) -> None:
    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=[item_job]) as jobs:
        with pytest.raises(JobsError) as err:
            await jobs.show(str(uuid.uuid4()))
        assert err.value.code == "X_JOB_NOT_FOUND"
        queued = await item_job.enqueue(Item("shown"), delay=60)
        view = await jobs.show(queued.id[:8])  # a prefix resolves through P:ids
        assert (view.id, view.state, view.name) == (queued.id, "delayed", item_job.name)
        assert [r.id for r in (await jobs.list()).rows] == [queued.id]
        assert (await jobs.promote(queued.id)).state == "ready"
        assert (await jobs.cancel(queued.id, reason="no")).state == "cancelled"
        assert (await jobs.requeue(queued.id)).state == "ready"
        await jobs.remove(queued.id)
        assert (await jobs.list()).rows == []
        assert sum(s.ready for s in await jobs.stats()) == 0


async def test_a_version_1_key_space_is_upgraded_in_place(
    redis_url: str, redis_prefix: str
) -> None:
    """Rows written under key-schema version 1 had no operator indexes: opening
    a driver of a later version indexes them, so list and id prefixes find them."""
    d = redis_driver(redis_url, prefix=redis_prefix)
    await d.open()
    try:
        ids = [r.id for r in await d.enqueue_many([req(f"old{i}") for i in range(3)])]
    finally:
        await d.close()
    async with raw(redis_url) as client:
        await client.delete([f"{redis_prefix}:all", f"{redis_prefix}:ids"])
        await client.set(f"{redis_prefix}:schema", "1")
    d = redis_driver(redis_url, prefix=redis_prefix)
    await d.open()
    try:
        assert d.introspect is not None
        from trio_jobs.drivers import ListFilter

        listed = {v.id for v in (await d.introspect.list(ListFilter())).rows}
        assert listed == set(ids)
        assert await d.introspect.resolve_id(ids[0][:13]) == ids[0]
    finally:
        await d.close()
    async with raw(redis_url) as client:
        assert await client.get(f"{redis_prefix}:schema") == str(SCHEMA_VERSION)


async def test_a_version_2_key_space_opens_as_version_3_and_its_open_entries_close(
    redis_url: str, redis_prefix: str
) -> None:
    """Version 2 kept a run's open attempt entry in the JSON log: opening a
    version-3 driver on its keys moves the stored version (nothing else to
    rewrite), and an entry version 2 left open is closed there by the ack."""
    d = redis_driver(redis_url, prefix=redis_prefix)
    await d.open()
    try:
        await d.enqueue_many([req("v2")])
        [job] = (await d.claim(_claim({"default": 1}))).jobs
    finally:
        await d.close()
    key = f"{redis_prefix}:job:{job.id}"
    async with raw(redis_url) as client:  # the row as version 2 wrote it
        started, worker = await client.hmget(key, ["oa", "ow"])
        await client.hdel(key, ["oa", "ow", "on"])
        old = [{"attempt": 1, "worker_id": worker, "started_at": started}]
        await client.hset(key, {"al": json.dumps(old, separators=(",", ":"))})
        await client.set(f"{redis_prefix}:schema", "2")
    d = redis_driver(redis_url, prefix=redis_prefix)
    await d.open()
    try:
        assert await d.ack(job.id, AckOptions(fence=job.fence))
        [entry] = await d.attempt_log(job.id)
        assert (entry.attempt, entry.worker_id, entry.outcome) == (1, "w", "done")
    finally:
        await d.close()
    async with raw(redis_url) as client:
        assert await client.get(f"{redis_prefix}:schema") == str(SCHEMA_VERSION) == "3"


async def test_debounce_and_unique_for_in_a_transaction(driver: RedisDriver) -> None:
    """A transaction stages debounced inputs as deduped onto the live row (its
    commit moves it with the last input) and a unique key's settled row."""
    first = (await driver.enqueue_many([req("deb", debounce=5.0)]))[0]
    async with driver.transaction() as tx:
        again = (await tx.enqueue_many([attrs.evolve(req("deb", debounce=5.0), payload={"v": 2})]))[
            0
        ]
        staged = await tx.enqueue_many(
            [
                attrs.evolve(req("deb2", debounce=5.0), payload={"v": 1}),
                attrs.evolve(req("deb2", debounce=5.0), payload={"v": 3}),
            ]
        )
    assert again.deduped
    assert again.id == first.id
    assert [r.deduped for r in staged] == [False, True]
    intro = driver.introspect
    assert intro is not None
    assert (await intro.show(first.id)).payload == {"v": 2}
    assert (await intro.show(staged[0].id)).payload == {"v": 3}
    assert (await intro.show(staged[0].id)).state == "delayed"
    unique = (await driver.enqueue_many([req("uq", unique_for=60.0)]))[0]
    got = (await driver.claim(_claim({"default": 10}))).jobs
    (held,) = [j for j in got if j.id == unique.id]
    assert await driver.ack(held.id, AckOptions(fence=held.fence))
    async with driver.transaction() as tx:
        inside = (await tx.enqueue_many([req("uq", unique_for=60.0)]))[0]
    assert inside.deduped
    assert inside.id == unique.id


@job(
    input=Item,
    tenant="none",
    idempotency_key=lambda i: i.key,
    concurrency=Concurrency(limit=1, key=lambda i: "one"),
    name="redis.capped",
)
async def capped(ctx: JobContext[Item]) -> None:
    await trio.sleep(0.05)


async def test_a_job_declaring_concurrency_runs_under_the_lease_store(
    redis_url: str, redis_prefix: str
) -> None:
    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=[capped]) as jobs:
        await capped.enqueue_many([Item(f"c{i}") for i in range(4)])
        worker = Worker(jobs, concurrency=4, poll_interval="20ms", idle_poll_max="100ms")
        peak = 0
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)  # no X_JOB_CONCURRENCY_UNENFORCEABLE
            leases = jobs.driver.leases
            assert leases is not None
            with trio.fail_after(20):
                while sum(s.done for s in await jobs.stats()) < 4:
                    peak = max(peak, await leases.held(capped.lease_key("one")))
                    await trio.sleep(0.005)
            await worker.drain()
    assert peak == 1  # the slot was seen held, and never twice


async def test_requests_keep_their_fields(driver: RedisDriver) -> None:
    r = EnqueueRequest(
        id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        name="full",
        queue="default",
        payload={"x": [1, 2.5, "ü"], "big": 2**60},
        idempotency_key="full",
        max_attempts=7,
        tenant_id="org-1",
        concurrency_key="ck",
        priority=-3,
        actor={"id": "u1", "org_id": "org-1", "permissions": []},
        trace_context={"traceparent": "00-abc-def-01"},
    )
    await driver.enqueue_many([r])
    got = (await driver.claim(_claim({"default": 1}))).jobs[0]
    assert (got.payload, got.tenant_id, got.concurrency_key, got.max_attempts) == (
        r.payload,
        "org-1",
        "ck",
        7,
    )
    assert got.actor == r.actor
    assert got.trace_context == r.trace_context
    assert got.steps == []


async def test_a_run_waiting_on_a_busy_key_starts_when_the_holder_settles(
    redis_url: str, redis_prefix: str
) -> None:
    await check_a_busy_key_wakes_its_waiter(redis_driver(redis_url, prefix=redis_prefix))


async def test_many_runs_queue_behind_few_keys(redis_url: str, redis_prefix: str) -> None:
    await check_many_runs_queue_behind_few_keys(redis_driver(redis_url, prefix=redis_prefix))


async def test_concurrent_acks_share_one_script_call(driver: RedisDriver) -> None:
    """The settle combiner: acks of many slots in flight together go out in
    one script call, each answered on its own (a stale fence in the batch is
    refused alone); a bad duration is refused before it joins a batch."""
    await driver.enqueue_many([req(f"a{i}") for i in range(40)])
    held = (await driver.claim(_claim({"default": 40}))).jobs
    assert len(held) == 40
    stale = attrs.evolve(held[0].fence, claim=held[0].fence.claim + 10_000)
    answers: dict[str, bool] = {}
    before = driver._acker.flushes

    async def settle(i: int) -> None:
        fence = stale if i == 0 else held[i].fence
        answers[held[i].id] = await driver.ack(held[i].id, AckOptions(fence=fence, result=i))

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(settle, i)
    assert driver._acker.flushes - before <= 2  # the first may go alone, the rest together
    assert answers[held[0].id] is False
    assert all(answers[j.id] for j in held[1:])
    with pytest.raises(JobsError) as err:
        await driver.ack(held[0].id, AckOptions(fence=held[0].fence, duration=float("nan")))
    assert err.value.code == "X_INVARIANT"
    assert await driver.ack(held[0].id, AckOptions(fence=held[0].fence, result=0))
    assert sum(s.done for s in await driver.stats()) == 40


# --------------------------------------------------------------------------- step records
async def test_a_row_without_step_records_skips_them_and_one_with_them_keeps_them(
    redis_url: str, driver: RedisDriver
) -> None:
    """A new row is stored as having no step records ('ns'): its claim does not
    read them and its ack does not expire them. The first record clears the
    flag, so a later claim carries it and the ack expires it with the row."""
    from trio_jobs.drivers import NackOptions, StepRecord

    await driver.enqueue_many([req("plain"), req("stepped")])
    plain, stepped = sorted(
        (await driver.claim(_claim({"default": 2}))).jobs, key=lambda j: j.idempotency_key
    )
    assert not plain.steps
    assert not stepped.steps
    record = StepRecord(name="fetch", status="completed", seq=1, executions=1, output={"n": 1})
    async with driver.transaction() as tx:
        assert await tx.put_step(stepped.id, stepped.fence, record)
    assert await driver.nack(stepped.id, NackOptions(fence=stepped.fence, state="ready"))
    [again] = (await driver.claim(_claim({"default": 1}))).jobs
    assert again.id == stepped.id
    assert [(s.name, s.output) for s in again.steps or ()] == [("fetch", {"n": 1})]
    assert await driver.ack(plain.id, AckOptions(fence=plain.fence))
    assert await driver.ack(again.id, AckOptions(fence=again.fence))
    prefix = driver.prefix
    async with raw(redis_url) as client:
        assert await client.hget(f"{prefix}:job:{plain.id}", "ns") == "1"
        assert await client.hget(f"{prefix}:job:{stepped.id}", "ns") is None
        assert await client.exists([f"{prefix}:steps:{plain.id}"]) == 0
        assert 0 < await client.ttl(f"{prefix}:steps:{stepped.id}")
        assert 0 < await client.ttl(f"{prefix}:job:{plain.id}")


# --------------------------------------------------------------------------- the attempt log's fields


_COMPACT = ("listpack", "ziplist")  # Redis 7 / Redis 6 names of the small-hash encoding


async def test_a_small_row_keeps_its_compact_encoding_through_its_claim_and_ack(
    driver: RedisDriver, redis_url: str
) -> None:
    """The open attempt and its done close live in short fields of their own: a
    row of small values stays a listpack (a JSON log over 64 bytes would turn it
    into a hashtable, about 4x the memory of a kept done row)."""
    await driver.enqueue_many([req("a")])
    [job] = (await driver.claim(_claim({"default": 1}))).jobs
    key = f"{driver.prefix}:job:{job.id}"
    async with raw(redis_url) as r:
        assert await r.object_encoding(key) in _COMPACT
        assert await driver.ack(job.id, AckOptions(fence=job.fence))
        assert await r.object_encoding(key) in _COMPACT
        assert await r.hget(key, "al") is None
    [entry] = await driver.attempt_log(job.id)
    assert (entry.attempt, entry.worker_id, entry.outcome) == (1, "w", "done")
    assert entry.ended_at is not None
    assert entry.started_at <= entry.ended_at


async def test_an_entry_older_scripts_left_open_in_the_log_is_closed_there(
    driver: RedisDriver, redis_url: str
) -> None:
    """A row claimed before the entry's fields existed holds its open entry in
    'al': the heartbeat's step, the ack and the nack still close it there, and
    the row's next claim opens its entry in the fields, after the old ones."""
    await driver.enqueue_many([req("a"), req("b")])
    a, b = (await driver.claim(_claim({"default": 2}))).jobs
    async with raw(redis_url) as r:
        for j in (a, b):  # rewrite each claimed row as the older scripts wrote it
            key = f"{driver.prefix}:job:{j.id}"
            started, worker, attempt = await r.hmget(key, ["oa", "ow", "on"])
            assert started is not None
            assert (worker, attempt) == ("w", "1")
            await r.hdel(key, ["oa", "ow", "on"])
            old = [{"attempt": 1, "worker_id": worker, "started_at": started}]
            await r.hset(key, {"al": json.dumps(old, separators=(",", ":"))})
    mark = StepMark("charge", driver.now())
    assert await driver.heartbeat([HeartbeatRequest(a.id, a.fence, step=mark)], 30.0) == ["ok"]
    [entry] = await driver.attempt_log(a.id)
    assert (entry.step, entry.outcome) == ("charge", None)
    assert await driver.ack(a.id, AckOptions(fence=a.fence))
    [entry] = await driver.attempt_log(a.id)
    assert (entry.attempt, entry.outcome, entry.step) == (1, "done", "charge")
    assert entry.ended_at is not None
    assert await driver.nack(
        b.id,
        NackOptions(
            fence=b.fence, state="ready", counted=True, error_code="X_BOOM", last_error="X_BOOM: no"
        ),
    )
    [entry] = await driver.attempt_log(b.id)
    assert (entry.outcome, entry.error_code) == ("retried", "X_BOOM")
    [again] = (await driver.claim(_claim({"default": 1}))).jobs
    assert again.id == b.id
    log = await driver.attempt_log(b.id)
    assert [(e.attempt, e.outcome) for e in log] == [(1, "retried"), (2, None)]
