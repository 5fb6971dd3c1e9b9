"""The outbox on PostgreSQL: the app's database records the enqueues, a relay
moves them onto a queue that lives elsewhere.

>>> async with open_jobs(redis_driver(url), jobs=[...], outbox=postgres_outbox(dsn)) as jobs:
...     async with jobs.transaction() as tx:            # a transaction on the app's database
...         await tx.execute("insert into posts ...")
...         await notify.enqueue(...)                   # staged in trio_jobs_outbox, same tx

The staging statement is one per 1,000 inputs and carries a transactional
``pg_notify`` on the outbox channel (at most one per queue per 250 ms per
process), so an idle relay passes at once when the app commits. The store
connects, migrates and listens exactly as the driver does: it runs on a
:class:`PostgresDriver` of its own over the app's database.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..._serialization import dumps
from ..._time import Clock
from ...errors import ErrorCode, JobsError
from ...outbox._codec import encode_event, encode_job
from ...outbox._protocol import OutboxBatch, OutboxRow, OutboxStore
from .._protocol import ENQUEUE_CHUNK, EnqueueRequest, EnqueueResult, Fence, StepRecord
from .._push_wake import PROBE_PREFIX
from ._bridge import Row, Transaction
from ._driver import NOTIFY_INTERVAL, PostgresDriver
from ._sql import query
from ._wake import PgWake

__all__ = ["PostgresOutbox", "postgres_outbox"]

#: The wake "queue" a relay waits on: any staging commit wakes it.
ANY_QUEUE = "*"
#: The queue column of an event row (an event belongs to no queue).
EVENT_QUEUE = ""


class _AnyWake(PgWake):
    """The outbox's LISTEN session: a notification for any queue wakes the relay."""

    def _deliver(self, payload: str) -> None:
        self.received += 1
        if payload.startswith(PROBE_PREFIX):
            if payload == self._probe_token:
                self._probe_back.set()
            return
        self.fire([ANY_QUEUE])


class PostgresOutbox:
    """An :class:`~trio_jobs.outbox.OutboxStore` over ``trio_jobs_outbox`` in the
    app's PostgreSQL database. See :func:`postgres_outbox`."""

    name = "postgres-outbox"

    def __init__(
        self,
        dsn: str | None = None,
        *,
        migrate: bool = True,
        schema: str | None = None,
        clock: Clock | None = None,
        pool_size: int = 10,
    ) -> None:
        self._pg = PostgresDriver(
            dsn, migrate=migrate, schema=schema, clock=clock, pool_size=pool_size
        )
        self._notified: dict[str, float] = {}
        self.wake: _AnyWake | None = _AnyWake(
            self._channel(),
            conninfo=lambda: self._pg.listen_dsn,
            send_probe=self._send_probe,
            start=self._pg._start_service_task,
        )

    def _channel(self) -> str:
        # A channel of its own: a worker on a Postgres queue in the same schema is
        # never woken by a staged row it cannot claim.
        return f"{self._pg.channel}_outbox"

    @property
    def dsn(self) -> str:
        """The connection string in use (after :meth:`open`)."""
        return self._pg.dsn

    async def open(self) -> None:
        await self._pg.open()
        if self.wake is not None:
            self.wake.channel = self._channel()
            self.wake.reset()

    async def close(self) -> None:
        await self._pg.close()

    def now(self) -> float:
        return self._pg.now()

    async def _send_probe(self, token: str) -> None:
        await self._pg.db.fetch("SELECT pg_notify(%s, %s)", (self._channel(), token))

    async def _fetch(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        return await self._pg._fetch(name, params)

    # ------------------------------------------------------------------ staging

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_OutboxTx]:
        async with self._pg.db.transaction() as tx:
            yield _OutboxTx(self, tx)

    def _notify_allowed(self, queues: Sequence[str]) -> list[str]:
        now = trio.current_time()
        return [q for q in set(queues) if self._notified.get(q, -math.inf) + NOTIFY_INTERVAL <= now]

    def _mark_notified(self, queues: Sequence[str] | None) -> None:
        if queues:
            now = trio.current_time()
            for q in queues:
                self._notified[q] = now

    def _fire_local(self) -> None:
        # A relay in this process hears its own commits without the round trip.
        if self.wake is not None:
            self.wake.fire([ANY_QUEUE])

    # ------------------------------------------------------------------ relaying

    async def claim(self, limit: int, lease: float) -> OutboxBatch:
        rows = await self._fetch("outbox_claim", {"limit": int(limit), "lease": float(lease)})
        if not rows:
            return OutboxBatch(rows=[], now=0.0)
        out = [
            OutboxRow(
                seq=int(r[0]),
                id=str(r[1]),
                data=r[2],
                staged_at=float(r[3]),
                attempts=int(r[4]),
                lease_until=float(r[5]),
            )
            for r in rows
        ]
        out.sort(key=lambda row: row.seq)
        return OutboxBatch(rows=out, now=float(rows[0][6]))

    async def mark_published(self, row_id: str) -> None:
        await self._fetch("outbox_mark_published", {"id": row_id})

    async def _mark_many(self, row_ids: Sequence[str]) -> None:
        await self._fetch("outbox_mark_published_many", {"ids": list(row_ids)})

    @property
    def mark_published_many(self) -> Callable[[Sequence[str]], Awaitable[None]] | None:
        return self._mark_many

    async def release(
        self,
        rows: Sequence[OutboxRow],
        *,
        poison: str | None = None,
        error: str | None = None,
        hold: float | None = None,
    ) -> None:
        if not rows:
            return
        await self._fetch(
            "outbox_release",
            {
                "ids": [r.id for r in rows],
                "leases": [r.lease_until for r in rows],
                "poison": poison,
                "error": error,
                "hold": hold,
            },
        )

    async def purge(self, older_than: float, limit: int) -> int:
        rows = await self._fetch(
            "outbox_purge", {"older_than": float(older_than), "limit": int(limit)}
        )
        return int(rows[0][0])

    async def pending(self) -> int:
        """Rows staged and not yet published."""
        rows = await self._fetch("outbox_pending", {})
        return int(rows[0][0])


class _OutboxTx:
    """The app's transaction on its own database: ``execute`` runs app SQL;
    ``enqueue_many`` and ``publish`` stage rows that commit or vanish with it.

    An enqueue staged here answers the ids it was staged with. Inputs sharing a
    key within this transaction are one job (the later ones ``deduped``); a key
    a live job already holds in the queue is deduped when the relay publishes,
    and the staged id then names no job (the queue keeps the live one)."""

    def __init__(self, store: PostgresOutbox, tx: Transaction) -> None:
        self._store = store
        self._tx = tx
        self._keys: dict[tuple[str, str | None, str], EnqueueResult] = {}
        self._hooked = False

    async def _stage(self, rows: list[tuple[str | None, str, dict[str, Any]]]) -> None:
        store = self._store
        for start in range(0, len(rows), ENQUEUE_CHUNK):
            chunk = rows[start : start + ENQUEUE_CHUNK]
            body = [
                {"ord": i, "id": row_id, "queue": queue, "request": request}
                for i, (row_id, queue, request) in enumerate(chunk, start=1)
            ]
            result = await self._tx.execute(
                query("outbox_stage"),
                {
                    "now": store._pg._now_param(),
                    "rows": dumps(body).decode(),
                    "channel": store._channel(),
                    "notify": store._notify_allowed([q for _i, q, _r in chunk]),
                },
            )
            if result:
                store._mark_notified(result[0][1])
        if not self._hooked:
            self._hooked = True
            self._tx.after_commit.append(store._fire_local)

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        out: list[EnqueueResult] = []
        staged: list[tuple[str | None, str, dict[str, Any]]] = []
        fresh: dict[tuple[str, str | None, str], EnqueueResult] = {}
        for r in requests:
            key = (r.name, r.tenant_id, r.idempotency_key)
            held = self._keys.get(key) or fresh.get(key)
            if held is not None:
                out.append(EnqueueResult(held.id, held.run_id, True))
                continue
            result = EnqueueResult(r.id, r.run_id, False)
            fresh[key] = result
            staged.append((r.id, r.queue, encode_job(r)))
            out.append(result)
        if staged:
            await self._stage(staged)
        # Only once the statement landed do these keys count as staged.
        self._keys.update(fresh)
        return out

    async def publish(self, name: str, payload: Any) -> None:
        # An event row has no id of its own to keep: the database makes one.
        await self._stage([(None, EVENT_QUEUE, encode_event(name, payload))])

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        return await self._tx.execute(sql, params if params else None)

    async def put_step(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            "ctx.step.transaction needs the step records and the app's tables in one "
            "database, and with outbox= the queue lives elsewhere; use ctx.step.run with "
            "an idempotent write (an upsert keyed by ctx.job_id), or put the queue in the "
            "app's database (open_jobs(postgres_driver(dsn)))",
        )


def postgres_outbox(
    dsn: str | None = None,
    *,
    migrate: bool = True,
    schema: str | None = None,
    clock: Clock | None = None,
    pool_size: int = 10,
) -> PostgresOutbox:
    """The outbox in the app's PostgreSQL database, for a queue that lives elsewhere.

    Pass it to ``open_jobs(queue_driver, jobs=[...], outbox=postgres_outbox(dsn))``:
    ``jobs.transaction()`` then opens a transaction on this database, and the
    enqueues and ``publish_event`` calls inside it are staged in
    ``trio_jobs_outbox``, committing or vanishing with the app's writes. Run a
    :class:`~trio_jobs.outbox.Relay` to move them onto the queue. ``dsn``,
    ``migrate``, ``schema``, ``clock`` (tests only) and ``pool_size`` are as for
    :func:`~trio_jobs.drivers.postgres.postgres_driver`. Constructing it does no I/O.
    """
    if pool_size < 1:
        raise JobsError(ErrorCode.X_CONFIG_INVALID, "pool_size must be 1 or more")
    return PostgresOutbox(dsn, migrate=migrate, schema=schema, clock=clock, pool_size=pool_size)


def _conforms(store: PostgresOutbox) -> OutboxStore:
    """mypy checks here that the store implements the protocol."""
    return store
