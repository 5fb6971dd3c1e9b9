"""Every Lua script checks its arguments before its first write (``lua/queue.lua``).

Redis does not roll a script back: one that fails half way keeps what it wrote.
An enqueue with ``run_at=nan`` used to store the job hash and its live key and
then fail on the NaN score, so the caller's retry was ``deduped=True`` onto a row
no worker would ever claim. Here each script is called below the facade,
directly on the driver, with bad arguments: it is refused with a code, and every
key under the prefix holds what it held before (read outside the scripts).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from trio_jobs.drivers import (
    AckOptions,
    ClaimedJob,
    ClaimOptions,
    HeartbeatRequest,
    NackOptions,
    TaskFire,
    TaskSpec,
)
from trio_jobs.drivers.redis import RedisDriver
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import contents, req
from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis


@attrs.frozen
class World:
    driver: RedisDriver
    held: ClaimedJob  # a running row this test's worker holds


@pytest.fixture
async def world(driver: RedisDriver) -> World:
    await driver.enqueue_many([req("held", concurrency_key="k")])
    [held] = (await driver.claim(ClaimOptions("w1", {"default": 1}, 30.0))).jobs
    assert (await driver.leases.acquire("lk", 1, held.id, held.fence, 30.0)).slot == 0  # type: ignore[union-attr]
    await driver.enqueue_many([req("waiting"), req("later", delay=60.0)])
    return World(driver, held)


Call = Callable[[World], Awaitable[Any]]


def _script(name: str, *args: str) -> Call:
    """A raw call of script ``name``: what a caller below the driver's own
    methods could send."""
    return lambda w: w.driver._script(name, list(args))


def _enqueue(**fields: Any) -> Call:
    return lambda w: w.driver.enqueue_many([req("new", **fields)])


def _nack(**fields: Any) -> Call:
    return lambda w: w.driver.nack(
        w.held.id, NackOptions(fence=w.held.fence, **{"state": "ready", **fields})
    )


async def _commit(w: World) -> None:
    async with w.driver.transaction() as tx:
        await tx.enqueue_many([req("staged-ok"), req("staged-bad", run_at=math.nan)])


CASES: list[tuple[str, ErrorCode, Call]] = [
    # enqueue: the reported leftover, and every row field that could score or count wrong
    ("enqueue run_at=nan", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(run_at=math.nan)),
    ("enqueue run_at=inf", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(run_at=math.inf)),
    ("enqueue run_at=1e20", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(run_at=1e20)),
    ("enqueue run_at=-5", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(run_at=-5.0)),
    ("enqueue delay=nan", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(delay=math.nan)),
    ("enqueue delay=1e300", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(delay=1e300)),
    ("enqueue delay=-1", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(delay=-1.0)),
    ("enqueue priority=2**40", ErrorCode.X_JOB_INPUT_INVALID, _enqueue(priority=2**40)),
    (
        "enqueue max_attempts=0",
        ErrorCode.X_JOB_INPUT_INVALID,
        lambda w: w.driver.enqueue_many([attrs.evolve(req("new"), max_attempts=0)]),
    ),
    (
        "enqueue: a good row, then a bad one",
        ErrorCode.X_JOB_INPUT_INVALID,
        lambda w: w.driver.enqueue_many([req("first-ok"), req("second", run_at=math.nan)]),
    ),
    (
        "enqueue: a row cut short",
        ErrorCode.X_JOB_INPUT_INVALID,
        _script("enqueue", "1", "id-only"),
    ),
    ("commit: a staged row with run_at=nan", ErrorCode.X_JOB_INPUT_INVALID, _commit),
    # claim, settles, heartbeat: what the worker sends
    (
        "claim visibility_timeout=nan",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.claim(ClaimOptions("w2", {"default": 5}, math.nan)),
    ),
    (
        "claim take=-1",
        ErrorCode.X_INVARIANT,
        _script("claim", "w2", "30.0", "lapsed", "0", "default", "-1"),
    ),
    (
        "ack duration=nan",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.ack(w.held.id, AckOptions(fence=w.held.fence, duration=math.nan)),
    ),
    ("ack claim='x'", ErrorCode.X_INVARIANT, _script("ack", "id", "w1", "x", "", "", "", "")),
    ("ack: a settle cut short", ErrorCode.X_INVARIANT, _script("ack", "id", "w1", "1")),
    (
        "ack: the held row's good settle, then one cut short",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver._script(
            "ack", [w.held.id, "w1", str(int(w.held.fence.claim)), "", "", "", "", "id2", "w1"]
        ),
    ),
    (
        "ack: a result not =-encoded",
        ErrorCode.X_INVARIANT,
        _script("ack", "id", "w1", "1", "null", "", "", ""),
    ),
    (
        "ack: a duration past 100 years",
        ErrorCode.X_INVARIANT,
        _script("ack", "id", "w1", "1", "", "", "=1e12", ""),
    ),
    ("ack: again='2'", ErrorCode.X_INVARIANT, _script("ack", "id", "w1", "1", "", "", "", "2")),
    ("nack run_at=nan", ErrorCode.X_INVARIANT, _nack(run_at=math.nan)),
    ("nack delay=inf", ErrorCode.X_INVARIANT, _nack(delay=math.inf)),
    ("nack run_at=1e20", ErrorCode.X_INVARIANT, _nack(run_at=1e20)),
    ("nack state='gone'", ErrorCode.X_INVARIANT, _nack(state="gone")),
    ("nack max_attempts=0", ErrorCode.X_INVARIANT, _nack(max_attempts=0)),
    (
        "heartbeat visibility_timeout=nan",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.heartbeat([HeartbeatRequest(w.held.id, w.held.fence)], math.nan),
    ),
    (
        "heartbeat: a request cut short",
        ErrorCode.X_INVARIANT,
        _script("heartbeat", "30.0", "2", "id", "w1", "1", ""),
    ),
    (
        "heartbeat: a step start that is no instant",
        ErrorCode.X_INVARIANT,
        _script("heartbeat", "30.0", "1", "id", "w1", "1", "", "charge", "nan"),
    ),
    (
        "release_orphans: a held claim 'x'",
        ErrorCode.X_INVARIANT,
        _script("release_orphans", "w1", "message", "its first line", "x"),
    ),
    # steps, events, leases
    (
        "step_put seq='x'",
        ErrorCode.X_INVARIANT,
        _script("step_put", "id", "w1", "1", "step", "x", "{}"),
    ),
    (
        "publish: no event name",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.events.publish("", {"n": 1}),
    ),
    (
        "lease_acquire limit=0",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.leases.acquire("lk2", 0, w.held.id, w.held.fence, 30.0),  # type: ignore[union-attr]
    ),
    (
        "lease_acquire ttl=nan",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.leases.acquire("lk2", 1, w.held.id, w.held.fence, math.nan),  # type: ignore[union-attr]
    ),
    (
        "lease_release: no job id",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.leases.release(""),  # type: ignore[union-attr]
    ),
    (
        "lease_held: no key",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.leases.held(""),  # type: ignore[union-attr]
    ),
    ("schema: version 'x'", ErrorCode.X_INVARIANT, _script("schema", "x")),
    # rate limits
    ("rate_acquire: no name", ErrorCode.X_INVARIANT, _script("rate_acquire", "", "k", "1", "1.0")),
    ("rate_acquire limit=0", ErrorCode.X_INVARIANT, _script("rate_acquire", "n", "k", "0", "1.0")),
    (
        "rate_acquire per=nan",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.rate_limits.acquire("n", "k", 1, math.nan),  # type: ignore[union-attr]
    ),
    ("rate_acquire per=0", ErrorCode.X_INVARIANT, _script("rate_acquire", "n", "k", "1", "0")),
    ("rate_acquire: no key", ErrorCode.X_INVARIANT, _script("rate_acquire", "n")),
    # the task store (lua/tasks.lua)
    (
        "task_lead ttl=nan",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.tasks.lead(
            "l", [TaskSpec("t", "every:60", "UTC", "all", "q")], math.nan
        ),  # type: ignore[union-attr]
    ),
    ("task_lead: incomplete", ErrorCode.X_INVARIANT, _script("task_lead", "l", "30", "1", "t")),
    (
        "task_fire watermark=nan",
        ErrorCode.X_INVARIANT,
        lambda w: w.driver.tasks.fire("l", [TaskFire("t", math.nan, 60.0)]),  # type: ignore[union-attr]
    ),
    (
        "task_fire a row with run_at=nan",
        ErrorCode.X_JOB_INPUT_INVALID,
        lambda w: w.driver.tasks.fire(  # type: ignore[union-attr]
            "l", [TaskFire("t", 0.0, 60.0, [req("r", run_at=math.nan)], 60.0)]
        ),
    ),
    ("task_pause: no name", ErrorCode.X_INVARIANT, lambda w: w.driver.tasks.pause("")),  # type: ignore[union-attr]
]


@pytest.mark.parametrize(("label", "code", "call"), CASES, ids=[c[0] for c in CASES])
async def test_a_script_refuses_bad_arguments_before_writing_anything(
    world: World, label: str, code: ErrorCode, call: Call
) -> None:
    before = await contents(world.driver)
    with pytest.raises(JobsError) as caught:
        await call(world)
    assert caught.value.code == code, caught.value
    assert "nothing was written" in caught.value.message
    assert await contents(world.driver) == before, label


async def test_every_script_refuses_a_clock_that_is_not_a_number(world: World) -> None:
    """The prelude every script shares checks the four leading arguments first."""

    class NanClock:
        def now(self) -> float:
            return math.nan

    d = world.driver
    before = await contents(d)
    d._clock = NanClock()
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: d.enqueue_many([req("clocked")]),
        lambda: d.claim(ClaimOptions("w1", {"default": 5}, 30.0)),
        lambda: d.ack(world.held.id, AckOptions(fence=world.held.fence)),
        lambda: d.heartbeat([HeartbeatRequest(world.held.id, world.held.fence)], 30.0),
        lambda: d.events.publish("paid", {"n": 1}),
        lambda: d.release_orphans("w1", frozenset()),
        d.stats,
    ]
    for call in calls:
        with pytest.raises(JobsError) as caught:
            await call()
        assert caught.value.code == ErrorCode.X_INVARIANT
        assert "clock" in caught.value.message
    d._clock = None
    assert await contents(d) == before


async def test_after_a_refused_enqueue_the_fixed_retry_is_a_new_row(world: World) -> None:
    """The reported consequence: the retry used to dedupe onto the leftover."""
    d = world.driver
    bad = req("retried", run_at=math.nan)
    with pytest.raises(JobsError):
        await d.enqueue_many([bad])
    [again] = await d.enqueue_many([attrs.evolve(bad, run_at=None)])
    assert not again.deduped
    taken = (await d.claim(ClaimOptions("w2", {"default": 10}, 30.0))).jobs
    assert again.id in {j.id for j in taken}  # a live row a worker claims
