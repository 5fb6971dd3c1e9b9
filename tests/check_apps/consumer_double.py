"""A consumer with a double effect: its handle adds each batch to a running
total outside the batch's transaction, so a crash after handle and before the
commit (the cursor not moved) adds the same batch twice."""

from __future__ import annotations

import math
from typing import Any

from trio_jobs import ConsumerBatch, Retry, Signal, Transaction, consumer

ITEMS = 7
totals: dict[str, int] = {}


async def _stream(key: str, cursor: str | None, signal: Signal) -> Any:
    after = -1 if cursor is None else int(cursor)
    for n in range(after + 1, ITEMS):
        yield n


async def _handle(batch: ConsumerBatch) -> str:
    # The bug: an effect outside batch.tx, not idempotent per item.
    totals[batch.key] = totals.get(batch.key, 0) + sum(batch.items)
    return str(batch.items[-1])


async def _load(key: str, tx: Transaction) -> str | None:
    found, _now = await tx.jobs.driver.events.poll(f"cursor:{key}", -math.inf)
    return str(found[-1].payload) if found else None


async def _save(key: str, cursor: str, tx: Transaction) -> None:
    await tx.driver_tx.publish(f"cursor:{key}", cursor)


totaller = consumer(
    name="app.totals",
    keys=lambda: ["k0"],
    open=_stream,
    handle=_handle,
    load_cursor=_load,
    save_cursor=_save,
    batch=3,
    retry=Retry(attempts=10),
)

trio_jobs_examples = {"app.totals": ["k0"]}


def trio_jobs_observe() -> dict[str, int]:
    return dict(sorted(totals.items()))


def trio_jobs_reset() -> None:
    totals.clear()
