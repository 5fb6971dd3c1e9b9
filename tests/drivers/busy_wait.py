"""A run waiting on a busy concurrency key, on a real driver: shared by the
PostgreSQL and Redis driver tests (both lease stores wake waiters)."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from jobs_support import count_acquires
from trio_jobs import Concurrency, JobContext, Worker, job, open_jobs
from trio_jobs.drivers import JobDriver


@attrs.frozen
class Charge:
    n: int


holding = {"release": trio.Event(), "started": {}}  # type: dict[str, Any]


@job(
    input=Charge,
    tenant="none",
    idempotency_key=lambda i: f"charge:{i.n}",
    concurrency=Concurrency(limit=1, key=lambda i: "acct-1"),
)
async def charge_account(ctx: JobContext[Charge]) -> None:
    holding["started"][ctx.input.n] = trio.current_time()
    if ctx.input.n == 0:
        await holding["release"].wait()


async def check_a_busy_key_wakes_its_waiter(driver: JobDriver) -> None:
    """On a real driver whose lease store wakes waiters: a run waiting on a busy
    key is not claimed again each poll while the key stays busy, and the
    holder's settle makes it due and wakes a worker: it starts at once, not an
    idle poll (here up to 30 s) later."""
    holding["release"] = trio.Event()
    holding["started"] = {}
    async with open_jobs(driver, jobs=[charge_account]) as jobs:
        asked = count_acquires(jobs.driver)
        holder = await charge_account.enqueue(Charge(0))
        options: dict[str, Any] = {"poll_interval": "50ms", "idle_poll_max": "30s"}
        async with trio.open_nursery() as nursery:
            workers = [Worker(jobs, **options), Worker(jobs, **options)]
            for w in workers:
                await nursery.start(w.run)
            with trio.fail_after(20):
                while 0 not in holding["started"]:  # noqa: ASYNC110 — bounded wait
                    await trio.sleep(0.01)
                waiting = await charge_account.enqueue(Charge(1))
                await trio.sleep(4)  # the idle workers back off to multi-second polls
                tries = asked.count(waiting.id)
                released = trio.current_time()
                holding["release"].set()
                while 1 not in holding["started"]:  # noqa: ASYNC110 — bounded wait
                    await trio.sleep(0.01)
                while sum(s.done for s in await jobs.stats()) < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            for w in workers:
                await w.drain()
        assert {holder.id, waiting.id} == set(asked)
    assert tries == 1  # claimed once at its enqueue, then waited on the key
    assert holding["started"][1] - released < 2.0


@attrs.frozen
class Transfer:
    n: int
    account: str


running_per_key: dict[str, int] = {}
peak_per_key: dict[str, int] = {}


@job(
    input=Transfer,
    tenant="none",
    idempotency_key=lambda i: f"transfer:{i.n}",
    concurrency=Concurrency(limit=1, key=lambda i: i.account),
)
async def transfer(ctx: JobContext[Transfer]) -> None:
    account = ctx.input.account
    running_per_key[account] = running_per_key.get(account, 0) + 1
    peak_per_key[account] = max(peak_per_key.get(account, 0), running_per_key[account])
    try:
        await ctx.step.run("move", lambda: ctx.input.n)
        await trio.sleep(0.01)
    finally:
        running_per_key[account] -= 1


async def check_many_runs_queue_behind_few_keys(driver: JobDriver) -> None:
    """Sixty runs over three keys, four workers with four slots each: every run
    ends done, never two at once on a key, and the waits are woken releases, not
    polls (a few slot requests per run, not one per 50 ms poll while waiting)."""
    running_per_key.clear()
    peak_per_key.clear()
    async with open_jobs(driver, jobs=[transfer]) as jobs:
        asked = count_acquires(jobs.driver)
        await transfer.enqueue_many([Transfer(n, f"acct-{n % 3}") for n in range(60)])
        options: dict[str, Any] = {"concurrency": 4, "poll_interval": "50ms"}
        async with trio.open_nursery() as nursery:
            workers = [Worker(jobs, **options) for _ in range(4)]
            for w in workers:
                await nursery.start(w.run)
            with trio.fail_after(60):
                while sum(s.done for s in await jobs.stats()) < 60:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            for w in workers:
                await w.drain()
    assert peak_per_key == {"acct-0": 1, "acct-1": 1, "acct-2": 1}
    # Each run asks once to start; a woken run may lose the slot to another and
    # ask again. Polled, the 40 runs waiting behind the keys would ask every 50 ms
    # for about a second: hundreds of requests.
    assert len(set(asked)) == 60
    assert len(asked) <= 60 * 3, len(asked)
