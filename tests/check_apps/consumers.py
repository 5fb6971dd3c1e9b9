"""A consumer the gate checks on the memory driver: each batch's effect and the
cursor past it are written through the batch's own transaction (published on
the memory driver's commit, as rows would be on PostgreSQL), so a crash between
handle and the commit loses both and the batch is handled again, once."""

from __future__ import annotations

import math
from typing import Any

from trio_jobs import ConsumerBatch, Retry, Signal, Transaction, consumer

#: Items 0..ITEMS-1 in every key's stream.
ITEMS = 7


async def _stream(key: str, cursor: str | None, signal: Signal) -> Any:
    after = -1 if cursor is None else int(cursor)
    for n in range(after + 1, ITEMS):
        yield n


async def _handle(batch: ConsumerBatch) -> str:
    await batch.tx.driver_tx.publish(f"handled:{batch.key}", list(batch.items))
    return str(batch.items[-1])


async def _load(key: str, tx: Transaction) -> str | None:
    found, _now = await tx.jobs.driver.events.poll(f"cursor:{key}", -math.inf)
    return str(found[-1].payload) if found else None


async def _save(key: str, cursor: str, tx: Transaction) -> None:
    await tx.driver_tx.publish(f"cursor:{key}", cursor)


streams = consumer(
    name="app.streams",
    keys=lambda: ["k0"],
    open=_stream,
    handle=_handle,
    load_cursor=_load,
    save_cursor=_save,
    batch=3,
    retry=Retry(attempts=10),
)

trio_jobs_examples = {"app.streams": ["k0", "k1"]}
