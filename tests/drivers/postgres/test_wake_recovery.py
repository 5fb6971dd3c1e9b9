"""The wake rides through a server restart (found by the chaos soak).

A restart ends the LISTEN session with FATAL 57P01. The session's read loop
runs inside a nursery, which wraps that failure in an ExceptionGroup; the
re-dial loop caught only the bare error, so the wake task died with its first
session (``jobs.postgres.task_failed``) while ``live`` stayed ``True``: no push
wake-ups ever again, and a 5 s poll ceiling the worker believed was backed by
them. ``pg_terminate_backend`` ends the session the way a restart does.
"""

from __future__ import annotations

import logging

import psycopg
import pytest
import trio

from trio_jobs.drivers.postgres import postgres_driver

from .conftest import req

pytestmark = pytest.mark.postgres


def _listener_pid(dsn: str, channel: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = %s", (f'LISTEN "{channel}"',)
        ).fetchone()
    return int(row[0]) if row else None


def _terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


async def test_a_lost_listen_session_is_redialled_and_proven_again(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs.postgres")
    worker = postgres_driver(pg_dsn, schema=pg_schema)
    app = postgres_driver(pg_dsn, schema=pg_schema)
    await worker.open()
    await app.open()
    try:
        wake = worker.wake
        assert wake is not None
        assert not await wake.wait(["default"], 0.01)  # starts the session
        with trio.fail_after(5):
            while not wake.live:  # noqa: ASYNC110 — a bounded poll of a flag, in a test
                await trio.sleep(0.01)
        pid = await trio.to_thread.run_sync(_listener_pid, pg_dsn, wake.channel)
        assert pid is not None
        assert wake.sessions == 1

        await trio.to_thread.run_sync(_terminate, pg_dsn, pid)
        # Unproven the moment the session is lost, then re-dialled and proven.
        with trio.fail_after(10):
            while wake.sessions < 2 or not wake.live:  # noqa: ASYNC110 — bounded, in a test
                await trio.sleep(0.01)
        assert "jobs.postgres.task_failed" not in caplog.text
        assert "jobs.wake.lost" in caplog.text

        # And it delivers: another driver's enqueue wakes a waiter at once.
        woke: list[bool] = []

        async def waiter() -> None:
            woke.append(await wake.wait(["default"], 5.0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(0.05)
            started = trio.current_time()
            await app.enqueue_many([req("after-the-restart")])
        assert woke == [True]
        assert trio.current_time() - started < 1.0
    finally:
        await worker.close()
        await app.close()


async def test_the_wake_is_unproven_while_its_session_is_down(pg_dsn: str, pg_schema: str) -> None:
    worker = postgres_driver(pg_dsn, schema=pg_schema)
    await worker.open()
    try:
        wake = worker.wake
        assert wake is not None
        assert not await wake.wait(["default"], 0.01)
        with trio.fail_after(5):
            while not wake.live:  # noqa: ASYNC110 — a bounded poll of a flag, in a test
                await trio.sleep(0.01)
        pid = await trio.to_thread.run_sync(_listener_pid, pg_dsn, wake.channel)
        assert pid is not None
        seen: list[bool] = []

        async def watch() -> None:
            # Sample `live` between the loss and the new session's probe.
            while wake.sessions < 2:
                seen.append(wake.live)
                await trio.lowlevel.checkpoint()
            seen.append(wake.live)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.to_thread.run_sync(_terminate, pg_dsn, pid)
            with trio.fail_after(10):
                while wake.sessions < 2:  # noqa: ASYNC110 — bounded, in a test
                    await trio.sleep(0.01)
        # The worker's poll ceiling drops to 2 s until the wake is proven again.
        assert False in seen
    finally:
        await worker.close()
