"""``consumer()`` on Redis (the driver has leases, transactions with fenced step
records and a task store, all a consumer needs): a run reads its stream in
batches, a failed batch commits nothing of what the library holds (its record,
its enqueues) and is delivered again from the committed cursor, and
``jobs.show(id).consumer`` answers the key and the last batch."""

from __future__ import annotations

import itertools

import attrs
import trio

from trio_jobs import (
    ConsumerBatch,
    JobContext,
    Retry,
    Worker,
    consumer,
    job,
    open_jobs,
    redis_driver,
)

from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis

STREAM = list(range(10))
cursors: dict[str, str] = {}
batches: list[list[int]] = []
marks: list[int] = []
tokens = itertools.count()


@attrs.frozen
class Seen:
    last: int
    token: int


@job(input=Seen, idempotency_key=lambda s: f"seen:{s.token}")  # a fresh key per enqueue
async def seen(ctx: JobContext[Seen]) -> None:
    marks.append(ctx.input.last)


async def handle(batch: ConsumerBatch) -> str:
    batches.append(list(batch.items))
    await seen.enqueue(Seen(batch.items[-1], next(tokens)))  # joins the batch's transaction
    if batch.items[0] == 4 and batches.count([4, 5, 6, 7]) == 1:
        raise ConnectionError("the target went away")  # batch 2 fails once
    return str(batch.items[-1])


feed = consumer(
    name="redis.feed",
    keys=lambda: ["k"],
    open=lambda key, cursor, signal: [n for n in STREAM if cursor is None or n > int(cursor)],
    handle=handle,
    load_cursor=lambda key, tx: cursors.get(key),
    save_cursor=lambda key, cursor, tx: cursors.__setitem__(key, cursor),
    batch=4,
    retry=Retry(attempts=3, base="50ms", jitter=False),
)


async def test_a_consumer_on_redis_redelivers_a_failed_batch_from_its_cursor(
    redis_url: str, redis_prefix: str
) -> None:
    cursors.clear()
    batches.clear()
    marks.clear()
    driver = redis_driver(redis_url, prefix=redis_prefix)
    async with open_jobs(driver, jobs=[feed, seen]) as jobs:
        [enqueued] = await feed.arm()
        worker = Worker(jobs, queues=["default"], poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while not (await jobs.stats()) or (await jobs.stats())[0].done < 4:  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await trio.sleep(0.5)  # a leaked enqueue of the failed batch would run meanwhile
            await worker.drain()
        [record] = await driver.steps.load(enqueued.id)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7], [8, 9]]
    assert cursors == {"k": "9"}
    assert sorted(marks) == [3, 7, 9]  # the failed batch's enqueue rolled back with it
    assert (record.name, record.status, record.output) == (
        "batch",
        "completed",
        {"cursor": "9", "batches": 2, "items": 6},
    )
