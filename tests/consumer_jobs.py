"""A consumer for the real-process tests (tests/drivers/postgres/test_consumer.py).

A worker subprocess serves it with ``python -m trio_jobs.cli worker consumer_jobs
--database-url DSN`` (``tests/`` on ``PYTHONPATH``; the DSN sets the test's
schema as the search_path). It reads ``cs_source`` for one account, three rows a
batch, and copies them into ``cs_target`` with a plain INSERT (a batch committed
twice would be a unique violation); its cursors live in ``cs_cursors``. The
first time it handles the batch starting at id 7 it leaves a file ``hung-7`` in
its working folder and hangs inside the batch's transaction, its rows written
and uncommitted: the test kills the process there.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from trio_jobs import ConsumerBatch, Retry, Signal, Transaction, consumer, current_jobs

TABLES = """
CREATE TABLE cs_source (id int PRIMARY KEY, account text NOT NULL);
INSERT INTO cs_source SELECT g, 'acct-1' FROM generate_series(1, 12) g;
CREATE TABLE cs_target (id int PRIMARY KEY, pid int NOT NULL);
CREATE TABLE cs_cursors (key text PRIMARY KEY, cursor text NOT NULL);
"""


async def rows_after(key: str, cursor: str | None, signal: Signal) -> list[int]:
    async with current_jobs().transaction() as tx:
        rows = await tx.execute(
            "SELECT id FROM cs_source WHERE account = %s AND id > %s ORDER BY id",
            (key, int(cursor or 0)),
        )
    return [int(r[0]) for r in rows]


async def copy(batch: ConsumerBatch) -> str:
    for i in batch.items:
        await batch.tx.execute("INSERT INTO cs_target (id, pid) VALUES (%s, %s)", (i, os.getpid()))
    marker = trio.Path(f"hung-{batch.items[0]}")
    if batch.items[0] == 7 and not await marker.exists():
        await marker.touch()
        await trio.sleep(3600)  # the test SIGKILLs the process here
    return str(batch.items[-1])


async def load(key: str, tx: Transaction) -> str | None:
    rows = await tx.execute("SELECT cursor FROM cs_cursors WHERE key = %s", (key,))
    return str(rows[0][0]) if rows else None


async def save(key: str, cursor: str, tx: Transaction) -> None:
    await tx.execute(
        "INSERT INTO cs_cursors (key, cursor) VALUES (%s, %s) "
        "ON CONFLICT (key) DO UPDATE SET cursor = excluded.cursor",
        (key, cursor),
    )


mirror: Any = consumer(
    name="proc.mirror",
    keys=lambda: ["acct-1"],
    open=rows_after,
    handle=copy,
    load_cursor=load,
    save_cursor=save,
    batch=3,
    retry=Retry(attempts=3, base="100ms"),
)
