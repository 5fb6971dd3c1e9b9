"""Retention (spec: Idempotency, "the hourly purge"): done rows go 14 days after
they settled, dead ones after 90, a live row never; the purge runs hourly.

Everything runs on Trio's MockClock: the memory driver follows it, so weeks
pass in virtual time. The per-driver rules are in the conformance suite.
"""

from __future__ import annotations

import logging
import uuid

import pytest
import trio

from trio_jobs import Retention, purge_expired
from trio_jobs.drivers import AckOptions, ClaimOptions, EnqueueRequest, NackOptions, memory_driver
from trio_jobs.drivers.memory import MemoryDriver
from trio_jobs.errors import JobsError

DAY = 86_400.0


def req(key: str, **kw: object) -> EnqueueRequest:
    return EnqueueRequest(
        id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        name="ret.job",
        queue="default",
        payload={"k": key},
        idempotency_key=key,
        max_attempts=3,
        **kw,  # type: ignore[arg-type]
    )


async def settle(driver: MemoryDriver, done: int, dead: int) -> list[str]:
    await driver.enqueue_many([req(f"k{i}") for i in range(done + dead)])
    got = await driver.claim(ClaimOptions("w", {"default": done + dead}, 30.0))
    for job in got.jobs[:done]:
        assert await driver.ack(job.id, AckOptions(fence=job.fence))
    for job in got.jobs[done:]:
        assert await driver.nack(job.id, NackOptions(fence=job.fence, state="dead"))
    return [j.id for j in got.jobs]


async def ids(driver: MemoryDriver) -> set[str]:
    return set(driver._rows)


async def test_purge_expired_uses_14_and_90_days(autojump_clock: trio.testing.MockClock) -> None:
    driver = memory_driver()
    await driver.open()
    settled = await settle(driver, done=2, dead=1)
    live = (await driver.enqueue_many([req("live", delay=400 * DAY)]))[0].id
    assert (await purge_expired(driver)).removed == 0
    await trio.sleep(14 * DAY + 1)
    result = await purge_expired(driver)
    assert result.removed == 2
    assert result.done_before == pytest.approx(driver.now() - 14 * DAY)
    assert await ids(driver) == {settled[2], live}
    await trio.sleep(76 * DAY)
    assert (await purge_expired(driver)).removed == 1
    await trio.sleep(400 * DAY)
    assert (await purge_expired(driver)).removed == 0
    assert await ids(driver) == {live}


async def test_retentions_are_configurable_and_batched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = memory_driver()
    await driver.open()
    await settle(driver, done=5, dead=0)
    await trio.sleep(2 * 3600)
    result = await purge_expired(driver, done_retention="1h", batch=2)  # three statements
    assert result.removed == 5
    with pytest.raises(JobsError) as err:
        await purge_expired(driver, done_retention="soon")
    assert err.value.code == "X_CONFIG_INVALID"


async def test_the_service_purges_at_start_and_then_hourly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = memory_driver()
    await driver.open()
    settled = await settle(driver, done=1, dead=0)
    async with trio.open_nursery() as nursery:
        retention = Retention(driver)
        await nursery.start(retention.run)
        assert retention.runs == 1
        # The row is eligible just after 14 d; the tick at exactly 14 d does not take it,
        # the next one (an hour later) does.
        await trio.sleep(14 * DAY + 1800)
        assert settled[0] in driver._rows
        await trio.sleep(3600)
        assert settled[0] not in driver._rows
        assert retention.removed == 1
        assert retention.runs == 14 * 24 + 2
        nursery.cancel_scope.cancel()


class NoOperatorSurface(MemoryDriver):
    def __init__(self) -> None:
        super().__init__()
        self.introspect = None


async def test_a_driver_without_an_operator_surface_cannot_purge(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    driver = NoOperatorSurface()
    with pytest.raises(JobsError) as err:
        await purge_expired(driver)
    assert err.value.code == "X_NOT_IMPLEMENTED"
    caplog.set_level(logging.INFO, logger="trio_jobs")
    with trio.fail_after(1):
        await Retention(driver).run()  # logs once and returns: nothing to run
    assert [getattr(r, "event", None) for r in caplog.records] == ["jobs.purge.unsupported"]
