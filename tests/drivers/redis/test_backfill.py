"""``backfill()`` on Redis: a pass run by a real worker keeps its ledger in keys
(``P:bf:<job id>``, ``P:bfs``) and answers ``jobs.backfills()``; the ledger's
scripts check their arguments before writing anything."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from trio_jobs import Retry, Worker, backfill, open_jobs, redis_driver
from trio_jobs.drivers import BackfillPage
from trio_jobs.drivers.redis import RedisDriver
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import contents
from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis

SOURCE = list(range(1, 11))
target: dict[int, int] = {}
handled: list[int] = []


def page(_input: None, after: int | None) -> tuple[list[int], int | None]:
    found = [i for i in SOURCE if i > (after or 0)][:4]
    return found, (found[-1] if found and found[-1] != SOURCE[-1] else None)


async def write(ids: list[int], _input: None) -> None:
    handled.append(ids[0])
    if ids[0] == 5 and handled.count(5) == 1:
        raise ConnectionError("the target went away")  # page 2 fails once
    for i in ids:
        target[i] = i


copy = backfill(
    name="redis.copy",
    idempotency_key=lambda _: "redis.copy",
    source=page,
    handle=write,
    retry=Retry(attempts=3, base="50ms", jitter=False),
)


async def test_a_pass_on_redis_resumes_at_its_failed_page_and_keeps_its_ledger(
    redis_url: str, redis_prefix: str
) -> None:
    target.clear()
    handled.clear()
    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=[copy]) as jobs:
        enqueued = await copy.enqueue(None)
        worker = Worker(jobs, queues=["default"], poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while not (await jobs.stats()) or (await jobs.stats())[0].done < 1:  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await worker.drain()
        [row] = await jobs.backfills()
        assert await jobs.backfills(name="other") == []
    assert handled == [1, 5, 5, 9]
    assert target == {i: i for i in SOURCE}
    assert (row.name, row.job_id, row.pages, row.items, row.cursor) == (
        "redis.copy",
        enqueued.id,
        3,
        10,
        None,
    )
    assert row.finished_at is not None
    assert row.started_at <= row.finished_at


Call = Callable[[RedisDriver], Awaitable[Any]]


def _script(name: str, *args: str) -> Call:
    return lambda d: d._script(name, list(args))


CASES: list[tuple[str, Call]] = [
    ("record: no job id", _script("backfill_record", "", "bf", "1", "1", "null", "0")),
    ("record: no name", _script("backfill_record", "j1", "", "1", "1", "null", "0")),
    ("record: pages=-1", _script("backfill_record", "j1", "bf", "-1", "1", "null", "0")),
    ("record: pages='x'", _script("backfill_record", "j1", "bf", "x", "1", "null", "0")),
    ("record: items=1.5", _script("backfill_record", "j1", "bf", "1", "1.5", "null", "0")),
    ("record: no cursor", _script("backfill_record", "j1", "bf", "1", "1", "", "0")),
    ("record: finished='yes'", _script("backfill_record", "j1", "bf", "1", "1", "null", "yes")),
    ("record: cut short", _script("backfill_record", "j1", "bf", "1")),
    ("list: limit=0", _script("backfill_list", "", "0")),
    ("list: limit=1001", _script("backfill_list", "", "1001")),
    ("list: no limit", _script("backfill_list", "")),
]


@pytest.mark.parametrize(("label", "call"), CASES, ids=[c[0] for c in CASES])
async def test_a_ledger_script_refuses_bad_arguments_before_writing_anything(
    driver: RedisDriver, label: str, call: Call
) -> None:
    assert driver.backfills is not None
    await driver.backfills.record(BackfillPage("j0", "bf", 2, 20, {"after": 20}))
    before = await contents(driver)
    with pytest.raises(JobsError) as caught:
        await call(driver)
    assert caught.value.code == ErrorCode.X_INVARIANT, caught.value
    assert "nothing was written" in caught.value.message
    assert await contents(driver) == before, label
