"""Jobs for the real-process tests (tests/drivers/postgres/test_processes.py).

A worker subprocess serves them with ``python -m trio_jobs.cli worker
process_jobs --database-url DSN`` (``tests/`` on ``PYTHONPATH``; the DSN sets
the test's schema as the search_path). They record what they do in tables of
that schema, through ``ctx.jobs.transaction()``, so the test process reads the
effects back. ``python -m process_jobs COMMAND DSN ...`` runs the enqueuing
side of a test in a process of its own.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import attrs
import orjson
import trio

from trio_jobs import JobContext, Retry, job, open_jobs

TABLES = """
CREATE TABLE proc_effects (
    key text NOT NULL, what text NOT NULL, attempt int NOT NULL, pid int NOT NULL,
    at float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp()));
CREATE TABLE proc_gauge (id int PRIMARY KEY, running int NOT NULL, peak int NOT NULL);
INSERT INTO proc_gauge VALUES (1, 0, 0);
CREATE TABLE app_rows (key text PRIMARY KEY);
"""


@attrs.frozen
class Work:
    key: str


async def effect(ctx: JobContext[Work], what: str) -> None:
    async with ctx.jobs.transaction() as tx:
        await tx.execute(
            "INSERT INTO proc_effects (key, what, attempt, pid) VALUES (%s, %s, %s, %s)",
            (ctx.input.key, what, ctx.attempt, os.getpid()),
        )


@job(
    input=Work,
    tenant="none",
    idempotency_key=lambda i: f"steps:{i.key}",
    retry=Retry(attempts=3, base="100ms"),
    name="proc.three_steps",
)
async def three_steps(ctx: JobContext[Work]) -> str:
    """Killed in ``two`` on its first attempt; the next attempt replays ``one``."""

    async def one() -> str:
        await effect(ctx, "one")
        return "one-done"

    async def two() -> str:
        await effect(ctx, "two-start")
        if ctx.attempt == 1:
            await trio.sleep(3600)  # the test SIGKILLs the process here
        await effect(ctx, "two-end")
        return "two-done"

    async def three() -> str:
        await effect(ctx, "three")
        return "three-done"

    await ctx.step.run("one", one)
    await ctx.step.run("two", two)
    return str(await ctx.step.run("three", three))


@job(input=Work, tenant="none", idempotency_key=lambda i: f"block:{i.key}", name="proc.blocker")
async def blocker(ctx: JobContext[Work]) -> None:
    """Waits until drained: the abort cancels the sleep."""

    async def wait() -> None:
        await effect(ctx, "wait-start")
        await trio.sleep(3600)

    await ctx.step.run("wait", wait)


@job(input=Work, tenant="none", idempotency_key=lambda i: f"stubborn:{i.key}", name="proc.stubborn")
async def stubborn(ctx: JobContext[Work]) -> None:
    """Ignores its abort: a drain can only abandon it."""
    await effect(ctx, "stubborn-start")
    with trio.CancelScope(shield=True):
        await trio.sleep(3600)


@job(
    input=Work,
    tenant="none",
    idempotency_key=lambda i: f"capped:{i.key}",
    concurrency=2,
    name="proc.capped",
)
async def capped(ctx: JobContext[Work]) -> None:
    """Counts the runs in flight fleet-wide, and the peak, in one row."""
    async with ctx.jobs.transaction() as tx:
        await tx.execute(
            "UPDATE proc_gauge SET running = running + 1, peak = greatest(peak, running + 1)"
        )
    await effect(ctx, "capped")
    await trio.sleep(0.3)
    async with ctx.jobs.transaction() as tx:
        await tx.execute("UPDATE proc_gauge SET running = running - 1")


@job(input=Work, tenant="none", idempotency_key=lambda i: f"pickup:{i.key}", name="proc.pickup")
async def pickup(ctx: JobContext[Work]) -> None:
    """Records when its body started (the database's clock)."""
    await effect(ctx, "started")


@job(input=Work, tenant="none", idempotency_key=lambda i: f"slow:{i.key}", name="proc.slow")
async def slow(ctx: JobContext[Work]) -> None:
    """Holds its slot a moment: a batch of them spreads over the workers."""
    await effect(ctx, "slow")
    await trio.sleep(0.3)


@job(input=Work, tenant="none", idempotency_key=lambda i: f"ghost:{i.key}", name="proc.ghost")
async def ghost(ctx: JobContext[Work]) -> None:
    """Enqueued in transactions that never commit: it must never run."""
    await effect(ctx, "ghost-ran")


@job(
    input=Work,
    tenant="none",
    idempotency_key=lambda i: f"atomic:{i.key}",
    retry=Retry(attempts=3, base="100ms"),
    name="proc.atomic",
)
async def atomic(ctx: JobContext[Work]) -> Any:
    """A ``step.transaction`` killed after its app write, before its commit, on
    its first attempt: the write must vanish with the process."""

    async def write(tx: Any) -> dict[str, int]:
        await tx.execute(
            "INSERT INTO proc_effects (key, what, attempt, pid) VALUES (%s, 'atomic', %s, %s)",
            (ctx.input.key, ctx.attempt, os.getpid()),
        )
        if ctx.attempt == 1:
            # Written, not committed: tell the test (a file: the database can't
            # see this transaction), which SIGKILLs the process here.
            await trio.Path(f"atomic-{ctx.input.key}").touch()
            await trio.sleep(3600)
        return {"attempt": ctx.attempt}

    return await ctx.step.transaction("write", write)


jobs = [three_steps, blocker, stubborn, capped, pickup, slow, ghost, atomic]


# --------------------------------------------------------------------------- the enqueuing side


def _say(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()


async def _stage_and_hang(dsn: str, key: str) -> None:
    """Write an app row and enqueue in one transaction, then hang before the
    commit (the test SIGKILLs the process)."""
    from trio_jobs.drivers.postgres import postgres_driver

    async with open_jobs(postgres_driver(dsn), jobs=jobs) as facade:
        async with facade.transaction() as tx:
            await tx.execute("INSERT INTO app_rows VALUES (%s)", (key,))
            enq = await ghost.enqueue(Work(key))
            _say({"staged": enq.id})
            await trio.sleep(3600)


async def _stage_and_raise(dsn: str, key: str) -> None:
    """The same transaction, rolled back by an exception in the handler."""
    from trio_jobs.drivers.postgres import postgres_driver

    async with open_jobs(postgres_driver(dsn), jobs=jobs) as facade:
        try:
            async with facade.transaction() as tx:
                await tx.execute("INSERT INTO app_rows VALUES (%s)", (key,))
                enq = await ghost.enqueue(Work(key))
                raise RuntimeError("the handler failed after the enqueue")
        except RuntimeError:
            _say({"rolled_back": enq.id})


async def _enqueue_on_go(dsn: str, key: str) -> None:
    """Connect, say ready, wait for the go (a line on stdin), enqueue ``key`` once.

    Blocking on stdin, not polling for a file: twenty processes polling every
    millisecond load a small box enough to stretch the race past its timeouts."""
    from trio_jobs.drivers.postgres import postgres_driver

    async with open_jobs(postgres_driver(dsn, pool_size=1), jobs=jobs):
        _say({"ready": os.getpid()})
        await trio.to_thread.run_sync(sys.stdin.readline)
        enq = await pickup.enqueue(Work(key))
        _say({"id": enq.id, "deduped": enq.deduped})


def main(argv: list[str]) -> None:
    command, dsn, *rest = argv
    if command == "stage-and-hang":
        trio.run(_stage_and_hang, dsn, rest[0])
    elif command == "stage-and-raise":
        trio.run(_stage_and_raise, dsn, rest[0])
    elif command == "enqueue-on-go":
        trio.run(_enqueue_on_go, dsn, rest[0])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
