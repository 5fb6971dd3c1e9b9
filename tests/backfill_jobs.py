"""A backfill for the real-process tests (tests/drivers/postgres/test_backfill.py).

A worker subprocess serves it with ``python -m trio_jobs.cli worker backfill_jobs
--database-url DSN`` (``tests/`` on ``PYTHONPATH``; the DSN sets the test's
schema as the search_path). It pages ``bf_source`` three ids at a time into
``bf_target`` (an upsert), logging every ``handle`` call in ``bf_handled``. The
first time it handles the page starting at id 7 it leaves a file ``hung-7`` in
its working folder and hangs: the test kills the process there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio

from trio_jobs import Retry, backfill, current_jobs

TABLES = """
CREATE TABLE bf_source (id int PRIMARY KEY);
INSERT INTO bf_source SELECT generate_series(1, 12);
CREATE TABLE bf_target (id int PRIMARY KEY, pid int NOT NULL);
CREATE TABLE bf_handled (
    first_id int NOT NULL, pid int NOT NULL,
    at float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp()));
"""

PAGE = 3


async def source(_input: None, after: int | None) -> tuple[list[int], int | None]:
    async with current_jobs().transaction() as tx:
        rows = await tx.execute(
            "SELECT id FROM bf_source WHERE id > %s ORDER BY id LIMIT %s", (after or 0, PAGE)
        )
    ids = [int(r[0]) for r in rows]
    return ids, (ids[-1] if len(ids) == PAGE else None)


async def handle(ids: list[int], _input: None) -> None:
    async with current_jobs().transaction() as tx:
        await tx.execute(
            "INSERT INTO bf_handled (first_id, pid) VALUES (%s, %s)",
            (ids[0] if ids else 0, os.getpid()),
        )
        for i in ids:
            await tx.execute(
                "INSERT INTO bf_target (id, pid) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
                (i, os.getpid()),
            )
    marker = Path(f"hung-{ids[0]}") if ids else None
    if ids and ids[0] == 7 and marker is not None and not marker.exists():
        marker.touch()
        await trio.sleep(3600)  # the test SIGKILLs the process here


copy_rows: Any = backfill(
    name="proc.copy-rows",
    idempotency_key=lambda _: "proc.copy-rows",
    source=source,
    handle=handle,
    retry=Retry(attempts=3, base="100ms"),
)
