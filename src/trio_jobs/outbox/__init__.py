"""The transactional outbox, for a queue that does not live in the app's database.

With the PostgreSQL driver the queue *is* in the app's database, and
``jobs.transaction()`` enqueues in the app's own transaction: no outbox is
needed. With a queue elsewhere (Redis, or the memory driver in a test), hand
``open_jobs`` an outbox in the app's database and run a :class:`Relay`:

>>> async with open_jobs(redis_driver(url), jobs=[notify], outbox=postgres_outbox(dsn)) as jobs:
...     async with trio.open_nursery() as nursery:
...         await nursery.start(Relay(jobs).run)
...         async with jobs.transaction() as tx:            # the app's database
...             await tx.execute("insert into posts (id) values (%s)", (post_id,))
...             await notify.enqueue(Notify(post_id))      # staged in the outbox, same tx

Rolled back, the job never existed; committed, the relay publishes it under
the id it was staged with (``Enqueued.id`` names it), at least once and never
as a second row. An enqueue outside a transaction goes straight to the queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._protocol import OutboxBatch, OutboxRow, OutboxStore
from ._relay import Relay, RelayStats

if TYPE_CHECKING:
    from ..drivers.postgres._outbox import PostgresOutbox, postgres_outbox

__all__ = [
    "OutboxBatch",
    "OutboxRow",
    "OutboxStore",
    "PostgresOutbox",
    "Relay",
    "RelayStats",
    "postgres_outbox",
]


def __getattr__(name: str) -> Any:
    # The PostgreSQL store imports this package's codec: resolved on first use,
    # so either module may be imported first.
    if name in ("PostgresOutbox", "postgres_outbox"):
        from ..drivers.postgres import _outbox

        return getattr(_outbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
