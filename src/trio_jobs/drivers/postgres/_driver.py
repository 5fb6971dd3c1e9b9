"""The PostgreSQL driver: the default queue.

Same semantics as the memory driver (the reference), in as few statements as
the protocol allows: ``enqueue_many`` is one statement per 1,000 requests,
``claim`` one statement (reap included), each settle one fenced statement that
also moves the counters and releases the leases, ``heartbeat`` one statement
for every held row, and step records from many slots are group-committed.

Due times and leases are decided with the database's clock; a test may pass a
``clock`` whose now is sent with every statement instead.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from itertools import count as _ordinals
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

import attrs
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..._serialization import dumps
from ..._time import Clock, SystemClock
from ...errors import DriverError, ErrorCode, JobsError
from .._attempt_log import attempt_records
from .._combine import Combiner
from .._cursor import decode_cursor, encode_cursor
from .._protocol import (
    CANCELLED_LINE,
    ENQUEUE_CHUNK,
    LAPSED_LINE,
    LIVE_STATES,
    MAX_BULK_ROWS,
    ORPHAN_MESSAGE,
    AckOptions,
    AttemptRecord,
    BulkAction,
    BulkFilter,
    BulkPreview,
    BulkResult,
    ChildState,
    ClaimedJob,
    ClaimOptions,
    ClaimResult,
    CounterRow,
    EnqueueBatch,
    EnqueueRequest,
    EnqueueResult,
    EventRecord,
    Exhausted,
    Fence,
    HeartbeatRequest,
    HeartbeatStatus,
    JobPage,
    JobView,
    LeaseGrant,
    ListFilter,
    NackOptions,
    Progress,
    QueueStats,
    RateGrant,
    RateLimitStore,
    StepRecord,
    StepView,
    WorkerInfo,
    first_line,
    nack_outcome,
)
from .._resolve import AMBIGUOUS_SHOWN, check_bulk_action, resolved_prefix
from .._service import ServiceTasks
from .._window import exact_wait
from ._backfills import PgBackfills
from ._bridge import Database, Pool, Row, TextParams, TextRow, Transaction, unavailable
from ._migrate import LATEST, migrate, out_of_date, schema_version, too_new
from ._sql import positional, query
from ._tasks import PgTasks
from ._wake import PgWake

__all__ = ["PostgresDriver"]

logger = logging.getLogger("trio_jobs.postgres")

#: At most one notification per queue per this many seconds, per process.
NOTIFY_INTERVAL = 0.25
#: The most step records one group commit writes.
STEP_BATCH = 500
#: The bound on one step-write statement: the step write's budget
#: (``_context.WRITE_BUDGET``; a test holds them equal).
STEP_WRITE_BUDGET = 10.0
#: Enqueue inputs whose key holder committed after the statement's snapshot are
#: asked again; this bounds the rounds.
ENQUEUE_ROUNDS = 8
#: The most settles remembered as possibly landed (their call raised) until the
#: same claim settles again; the oldest is forgotten first.
UNSURE_KEPT = 10_000

_LAPSE_MESSAGE = (
    f"{ErrorCode.X_JOB_LEASE_LOST}: the lease lapsed on the final attempt "
    f"(%s of %s); the worker holding it died or stopped renewing it — "
    f"{ErrorCode.X_JOB_MAX_ATTEMPTS}"
)


#: Runs one named query with its parameters (on the pool, or in a transaction).
_Run = Callable[[str, Mapping[str, Any]], Awaitable[list[Row]]]
#: Runs one ``$n`` statement through libpq directly (``Database.fetch_text``, or
#: the transaction's), parameters and answer as text.
_RunText = Callable[[str, TextParams], Awaitable[list[TextRow]]]


#: EnqueueRequest columns a batch usually shares: sent once when it does.
_SHARED_SCALARS = (
    "name",
    "queue",
    "tenant_id",
    "concurrency_key",
    "max_attempts",
    "priority",
    "run_at",
    "delay",
    "sensitive",
    "parent_id",
    "parent_wait",
)
_SHARED_JSON = ("actor", "trace_context")
#: A request's (debounce, unique_for): a batch of plain requests maps to one
#: value only, found without a Python step per request.
_KEYED = attrgetter("debounce", "unique_for")
_UNKEYED = {(None, None)}
_PARENT_WAIT = attrgetter("parent_wait")  # a uuid string, or None
#: What makes two requests of a batch one job (a live key): name, tenant, key.
_LIVE_KEY = attrgetter("name", "tenant_id", "idempotency_key")
_ID = attrgetter("id")
_RUN_ID = attrgetter("run_id")


def _json(value: Any) -> str:
    return dumps(value).decode()


def _json_or_none(value: Any) -> str | None:
    return None if value is None else dumps(value).decode()


def _present(**fields: Any) -> dict[str, Any]:
    """One row of a JSON batch: keys whose value is None are left out (the
    server's ``json_to_recordset`` reads an absent key as NULL), which keeps the
    text the server parses short."""
    return {k: v for k, v in fields.items() if v is not None}


def _progress_json(progress: Progress | None) -> str | None:
    if progress is None:
        return None
    return _json({"done": progress.done, "total": progress.total, "note": progress.note})


def _progress(value: Any) -> Progress | None:
    if not isinstance(value, Mapping):
        return None
    return Progress(float(value["done"]), float(value["total"]), value.get("note"))


def conninfo_with_schema(dsn: str, schema: str | None) -> str:
    """``dsn`` with ``search_path`` set to ``schema`` (unchanged for ``None``).

    For a direct session (a test's own connection, a tool): the driver itself
    never sends it (see :func:`lift_search_path`)."""
    if schema is None:
        return dsn
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c search_path={schema}".strip()
    return make_conninfo("", **params)


_SEARCH_PATH_RE = re.compile(r"(?:-c\s*|--)search_path=(\S*)")


def lift_search_path(dsn: str) -> tuple[str, str | None]:
    """``dsn`` without a ``-c search_path=NAME`` in its startup ``options``, and
    that ``NAME`` (``None`` when there is none).

    The driver names its schema in every statement instead (``Database``): a
    pooler commonly drops startup ``options`` (PgBouncer's
    ``ignore_startup_parameters``) or refuses the connection over them, and the
    tables would land in ``public`` without a word. A search path of more than
    one schema is refused: which one holds the tables is the driver's to know."""
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    found = _SEARCH_PATH_RE.findall(options)
    if not found:
        return dsn, None
    value = found[-1].strip('"')
    if not value or "," in value or value.startswith("$"):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "the connection string's options set a search_path other than one schema; "
            "pass the schema that holds the tables as schema= and drop search_path from "
            "the options",
        )
    rest = _SEARCH_PATH_RE.sub("", options).strip()
    if rest:
        params["options"] = rest
    else:
        params.pop("options", None)
    return make_conninfo("", **params), value


def _channel(schema: str) -> str:
    """The NOTIFY channel: one per schema, so schemas sharing a database do not
    wake each other (a channel name is an identifier: at most 63 bytes)."""
    if schema == "public":
        return "trio_jobs"
    digest = hashlib.blake2s(schema.encode(), digest_size=6).hexdigest()
    return f"trio_jobs_{digest}"


def _text(value: Any) -> str | None:
    """A parameter's text form, as PostgreSQL reads it back: ``t``/``f`` for a
    bool, ``repr`` for an int or a float (a float's repr parses back to the same
    double), the string itself for text and uuids."""
    if value is None or type(value) is str:
        return value
    if value is True:
        return "t"
    if value is False:
        return "f"
    return repr(value)


def _json_text(value: Any) -> str | None:
    return None if value is None else dumps(value).decode()


def _one_params(
    r: EnqueueRequest, names: Sequence[str], *, now: float | None, channel: str, notify: bool
) -> list[str | None]:
    """enqueue_one's parameters in their ``$n`` order, as text."""
    by_name = {
        "id": r.id,
        "run_id": r.run_id,
        "name": r.name,
        "queue": r.queue,
        "payload": _json_text(r.payload),
        "tenant_id": r.tenant_id,
        "key": r.idempotency_key,
        "ckey": r.concurrency_key,
        "max_attempts": _text(r.max_attempts),
        "priority": _text(r.priority),
        "run_at": _text(r.run_at),
        "delay": _text(r.delay),
        "actor": _json_text(r.actor),
        "trace_context": _json_text(r.trace_context),
        "sensitive": _text(r.sensitive),
        "parent_id": r.parent_id,
        "parent_wait": r.parent_wait,
        "now": _text(now),
        "channel": channel,
        "notify": "t" if notify else "f",
    }
    return [by_name[name] for name in names]


_INT64_MIN = -(2**63)
_UINT64_LIMIT = 2**64  # orjson writes ints in [-2**63, 2**64) and refuses the rest

#: enqueue_one's parameters in the order sql/queue.sql numbers them: what
#: :func:`_one_values` answers (any other order takes :func:`_one_params`).
_ONE_ORDER = (
    "id",
    "run_id",
    "name",
    "queue",
    "payload",
    "tenant_id",
    "key",
    "ckey",
    "max_attempts",
    "priority",
    "actor",
    "trace_context",
    "sensitive",
    "parent_id",
    "parent_wait",
    "run_at",
    "delay",
    "now",
    "notify",
    "channel",
)


def _one_values(
    r: EnqueueRequest, *, now: float | None, channel: str, notify: bool
) -> list[str | None]:
    """:func:`_one_params` for the names in :data:`_ONE_ORDER`, without the dict
    (a single enqueue builds it per call)."""
    payload = r.payload
    actor = r.actor
    trace_context = r.trace_context
    run_at = r.run_at
    delay = r.delay
    return [
        r.id,
        r.run_id,
        r.name,
        r.queue,
        # An int's JSON is its decimal form (orjson writes the same digits).
        str(payload)
        if type(payload) is int and _INT64_MIN <= payload < _UINT64_LIMIT
        else _json_text(payload),
        r.tenant_id,
        r.idempotency_key,
        r.concurrency_key,
        str(r.max_attempts),
        str(r.priority),
        None if actor is None else _json_text(actor),
        None if trace_context is None else _json_text(trace_context),
        "t" if r.sensitive else "f",
        r.parent_id,
        r.parent_wait,
        None if run_at is None else _text(run_at),
        None if delay is None else _text(delay),
        None if now is None else _text(now),
        "t" if notify else "f",
        channel,
    ]


def _row_params(r: EnqueueRequest) -> dict[str, Any]:
    """One request's columns as enqueue_one and enqueue_keyed name them."""
    return {
        "id": r.id,
        "run_id": r.run_id,
        "name": r.name,
        "queue": r.queue,
        "payload": _json_or_none(r.payload),
        "tenant_id": r.tenant_id,
        "key": r.idempotency_key,
        "ckey": r.concurrency_key,
        "max_attempts": r.max_attempts,
        "priority": r.priority,
        "run_at": r.run_at,
        "delay": r.delay,
        "actor": _json_or_none(r.actor),
        "trace_context": _json_or_none(r.trace_context),
        "sensitive": r.sensitive,
        "parent_id": r.parent_id,
        "parent_wait": r.parent_wait,
    }


class PostgresDriver:
    """The PostgreSQL driver. See :func:`~trio_jobs.drivers.postgres.postgres_driver`."""

    name = "postgres"
    #: How often a waiting run re-checks for its event when the job declares no
    #: ``event_poll``: a publish makes its waiters due in the same statement, so
    #: this is only the backstop (the spec's 15 min).
    event_poll_default = 900.0

    def __init__(
        self,
        dsn: str | None = None,
        *,
        migrate: bool = True,
        schema: str | None = None,
        clock: Clock | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        step_linger: float = 0.0,
        listen_dsn: str | None = None,
        prepared_statements: bool | None = None,
        keep_done: bool = True,
    ) -> None:
        self._dsn_arg = dsn
        #: False: a job that settles done is deleted by its ack (done_retention=0).
        self.keep_done = keep_done
        self._ack_query = "ack_many" if keep_done else "ack_many_unkept"
        self._listen_dsn_arg = listen_dsn
        self._prepare = prepared_statements
        #: Whether statements are prepared on the server (decided at open).
        self.prepared_statements = bool(prepared_statements)
        self._listen_conninfo = ""
        self._migrate = migrate
        self._schema_arg = schema
        self._clock = clock
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._step_linger = step_linger
        self._system = SystemClock()
        self._skew = 0.0
        self._db: Database | None = None
        self._conninfo = ""
        self.schema = schema or "public"
        self.channel = _channel(self.schema)
        self._notified: dict[str, float] = {}
        self._service = ServiceTasks("postgres", logger)
        self._step_writer = self._combiner(
            self._flush_steps, linger=step_linger, budget=STEP_WRITE_BUDGET
        )
        self._acker = self._combiner(self._flush_acks)
        self._registry = _Registry()
        # Settles whose call raised (the statement may have committed, its answer
        # lost): the next settle of the same claim is a retry (see ack).
        self._unsure: dict[tuple[str, int], bool] = {}
        self.steps = _PgSteps(self)
        self.events = _PgEvents(self)
        self.leases: _PgLeases | None = _PgLeases(self)
        self.rate_limits: RateLimitStore | None = _PgRateLimits(self)
        self.introspect: _PgIntrospection | None = _PgIntrospection(self)
        self.backfills: PgBackfills | None = PgBackfills(self)
        self.tasks: PgTasks | None = PgTasks(self)
        self.acks: _PgAcks | None = _PgAcks(self)
        self.wake: PgWake | None = PgWake(
            self.channel,
            conninfo=lambda: self.listen_dsn,
            send_probe=self._send_probe,
            start=self._start_service_task,
        )
        self.opened = False
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def dsn(self) -> str:
        """The connection string in use (after :meth:`open`), with the schema as a
        startup ``search_path`` for a direct session of one's own."""
        return self._conninfo

    @property
    def listen_dsn(self) -> str:
        """Where the LISTEN session connects (after :meth:`open`): ``listen_dsn``,
        else the pool's connection string."""
        return self._listen_conninfo

    @property
    def db(self) -> Database:
        if self._db is None or self.closed:
            raise unavailable(
                None,
                "PostgreSQL (the driver is not open: enter it with open_jobs(...) or "
                "await driver.open())",
            )
        return self._db

    async def _resolve_dsn(self) -> str:
        if self._dsn_arg:
            return self._dsn_arg
        env = os.environ.get("DATABASE_URL")
        if env:
            return env
        from ._embedded import embedded_dsn

        return await embedded_dsn()

    async def open(self) -> None:
        """Open outside ``open_jobs``: the driver's tasks run in a Trio system
        task until :meth:`close` (the fallback; ``open_jobs`` uses :meth:`open_in`)."""
        await self._open(None)

    @asynccontextmanager
    async def open_in(self, nursery: trio.Nursery) -> AsyncIterator[None]:
        """Open for the block, the step writer, the acker and the LISTEN session
        in a task of ``nursery``; leaving the block closes the driver."""
        await self._open(nursery)
        try:
            yield
        finally:
            await self.close()

    async def _open(self, nursery: trio.Nursery | None) -> None:
        if self.opened and not self.closed:
            return
        dsn = await self._resolve_dsn()
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "the PostgreSQL connection string does not parse; pass a URI "
                "(postgresql://user@host/db) or a libpq key=value string",
            ) from None
        base, lifted = lift_search_path(make_conninfo("", **params))
        schema = self._schema_arg or lifted
        self._conninfo = conninfo_with_schema(base, schema)
        self._listen_conninfo = (
            lift_search_path(self._listen_dsn_arg)[0] if self._listen_dsn_arg else base
        )
        self._db = Database(
            Pool(
                base,
                max_size=self._pool_size,
                connect_timeout=self._connect_timeout,
                prepare=bool(self._prepare),
            ),
            schema=schema,
        )
        try:
            if schema is not None:
                rows = await self._db.fetch(
                    "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
                )
                if not rows:
                    raise JobsError(
                        ErrorCode.X_CONFIG_INVALID,
                        f"schema= names a schema the database does not have ({schema!r}); "
                        "create it first (CREATE SCHEMA) or pass the one that holds the tables",
                    )
            else:
                rows = await self._db.fetch("SELECT current_schema()")
            self.schema = schema if schema is not None else str(rows[0][0] or "public")
            if self._prepare is None:
                # Prepared statements save the claim's parse and plan (1.7x its
                # time here), but break behind a pooler: on only where the
                # connection proves to reach the server itself.
                direct = await self._db.is_direct()
                self._db.prepare_from_now(direct)
                self.prepared_statements = direct
            else:
                self.prepared_statements = self._prepare
            self.channel = _channel(self.schema)
            if self.wake is not None:
                self.wake.channel = self.channel
            if self._migrate:
                await migrate(self._db)
            else:
                version = await schema_version(self._db)
                if version < LATEST:
                    raise out_of_date(version)
                if version > LATEST:
                    raise too_new(version)
            await self._measure_skew()
            if self.wake is not None:
                self.wake.reset()
            await self._start_service(nursery)
        except BaseException:
            await self._db.pool.close()
            self._db = None
            raise
        self.opened = True
        self.closed = False

    async def _measure_skew(self) -> None:
        if self._clock is not None:
            return
        before = self._system.now()
        rows = await self.db.fetch(query("now"), {"now": None})
        after = self._system.now()
        self._skew = float(rows[0][0]) - (before + after) / 2

    def _combiner(
        self,
        flush: Callable[[builtins.list[Any]], Awaitable[set[int]]],
        *,
        linger: float = 0.0,
        budget: float | None = None,
    ) -> Combiner:
        """A write combiner (``drivers/_combine.py``): many tasks' writes, one
        statement per batch; the rows still queued at close are answered by
        :meth:`close`. With a ``budget``, each statement is bounded by it and the
        writes may wait shielded (:meth:`Combiner.submit_shielded`): the rows
        still queued when the writer stops are answered then."""
        return Combiner(
            flush,
            lambda: self.db,
            lambda: unavailable(None, "PostgreSQL (the driver closed mid-write)"),
            exit_error=(
                None
                if budget is None
                else lambda: unavailable(None, "PostgreSQL (the driver's writer stopped)")
            ),
            linger=linger,
            batch=STEP_BATCH,
            budget=budget,
            hung_error=lambda: DriverError(
                ErrorCode.X_DRIVER_UNAVAILABLE,
                f"a step write got no answer from PostgreSQL within the {budget:g} s write "
                "budget; the run is handed back uncounted and a replay resolves whether "
                "it landed",
            ),
        )

    async def _start_service(self, nursery: trio.Nursery | None) -> None:
        """Run the driver's own tasks (the step writer, the acker, the LISTEN
        session) in ``nursery``, else a system task (see :class:`ServiceTasks`)."""
        await self._service.start(self._step_writer.run, self._acker.run, nursery=nursery)

    def _start_service_task(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._service.spawn(fn, lambda: unavailable(None, "PostgreSQL (the driver is not open)"))

    async def close(self) -> None:
        if self.closed or self._db is None:
            self.closed = True
            return
        self.closed = True
        await self._service.stop()
        for combiner in (self._step_writer, self._acker):
            combiner.fail_pending(unavailable(None, "PostgreSQL (the driver closed)"))
        await self._db.pool.close()

    def now(self) -> float:
        if self._clock is not None:
            return self._clock.now()
        return self._system.now() + self._skew

    def _now_param(self) -> float | None:
        return None if self._clock is None else self._clock.now()

    async def _fetch(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        return await self.db.fetch(query(name), {"now": self._now_param(), **params})

    async def _send_probe(self, token: str) -> None:
        await self.db.fetch("SELECT pg_notify(%s, %s)", (self.channel, token))

    # ------------------------------------------------------------------ wake

    def _notify_allowed(self, queues: Sequence[str]) -> list[str]:
        """The queues this process may announce now (one per queue per 250 ms)."""
        now = trio.current_time()
        return [q for q in set(queues) if self._notified.get(q, -math.inf) + NOTIFY_INTERVAL <= now]

    def _quiet_queues(self) -> list[str]:
        """The queues this process announced within the last 250 ms."""
        now = trio.current_time()
        return [q for q, at in self._notified.items() if at + NOTIFY_INTERVAL > now]

    def _mark_notified(self, queues: Sequence[str] | None) -> None:
        if queues:
            now = trio.current_time()
            for q in queues:
                self._notified[q] = now

    def _fire(self, queues: Sequence[str]) -> None:
        if queues and self.wake is not None:
            self.wake.fire(list(queues))

    # ------------------------------------------------------------------ enqueue

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        if len(requests) == 1:
            # A single enqueue, the common case: straight to its one statement,
            # and to enqueue_many's statement only when it met a held key.
            only = requests[0]
            if only.debounce is None and only.unique_for is None and only.parent_wait is None:
                db = self.db
                inserted = await self._enqueue_one(db.fetch_text, only, after_commit=None)
                if inserted is not None:
                    return [inserted]
                return await self._enqueue_batch(self._fetch, requests, after_commit=None)
        return await self._enqueue(
            self._fetch, requests, after_commit=None, text=self.db.fetch_text
        )

    async def _enqueue(
        self,
        run: _Run,
        requests: Sequence[EnqueueRequest],
        *,
        after_commit: list[Callable[[], None]] | None,
        text: _RunText,
    ) -> list[EnqueueResult]:
        out = await self._enqueue_rows(run, requests, after_commit=after_commit, text=text)
        # A batch staged as columns names no parent (a step's children are requests).
        if not isinstance(requests, EnqueueBatch) and any(map(_PARENT_WAIT, requests)):
            await self._adopt(run, requests, out)
        return out

    async def _adopt(
        self, run: _Run, requests: Sequence[EnqueueRequest], out: Sequence[EnqueueResult]
    ) -> None:
        """A step's children counted on its wait (children_adopt), in the
        transaction that enqueued them: only those that inserted."""
        counts: dict[tuple[str, str], int] = {}
        for r, got in zip(requests, out, strict=True):
            if r.parent_wait is not None and r.parent_id is not None and not got.deduped:
                key = (r.parent_id, r.parent_wait)
                counts[key] = counts.get(key, 0) + 1
        for (parent_id, wait), count in sorted(counts.items()):
            await run(
                "children_adopt",
                {"parent_id": parent_id, "wait": wait, "count": count, "channel": self.channel},
            )

    async def _enqueue_rows(
        self,
        run: _Run,
        requests: Sequence[EnqueueRequest],
        *,
        after_commit: list[Callable[[], None]] | None,
        text: _RunText,
    ) -> list[EnqueueResult]:
        self.db  # noqa: B018 — refuse a closed driver before any work
        if len(requests) == 1:
            only = requests[0]
            if only.debounce is None and only.unique_for is None:
                inserted = await self._enqueue_one(text, only, after_commit=after_commit)
                if inserted is not None:
                    return [inserted]
                # The key is held (or the id known): enqueue_many names the holder.
            else:
                return await self._enqueue_keyed(run, requests, after_commit=after_commit)
        elif isinstance(requests, EnqueueBatch):
            if requests.debounce is not None or requests.unique_for is not None:
                return await self._enqueue_keyed(run, requests, after_commit=after_commit)
        elif set(map(_KEYED, requests)) != _UNKEYED:
            return await self._enqueue_keyed(run, requests, after_commit=after_commit)
        return await self._enqueue_batch(run, requests, after_commit=after_commit)

    async def _enqueue_batch(
        self,
        run: _Run,
        requests: Sequence[EnqueueRequest],
        *,
        after_commit: list[Callable[[], None]] | None,
    ) -> list[EnqueueResult]:
        """Requests of no ``debounce=``/``unique_for=`` job through enqueue_many's
        statement, one per 1,000; the holders of held keys named."""
        out: list[EnqueueResult | None] = [None] * len(requests)
        ready_queues: set[str] = set()
        # The columns the loops below read: a batch staged as columns has them
        # (its rows share the job's name, so the tenant and the key make its live
        # key); any other sequence, one C-level pass each.
        if isinstance(requests, EnqueueBatch):
            ids, run_ids = requests.ids, requests.run_ids
            tenants = requests.tenant_ids
            live: list[Any] = (
                requests.idempotency_keys
                if tenants is None
                else list(zip(tenants, requests.idempotency_keys, strict=True))
            )
        else:
            ids = list(map(_ID, requests))
            run_ids = list(map(_RUN_ID, requests))
            live = list(map(_LIVE_KEY, requests))
        # A batch tries enqueue_fresh first (a plain INSERT, no ON CONFLICT
        # probe per row); after one chunk met a held key, the call's later
        # chunks go straight to enqueue_many. A lone request here is one whose
        # key enqueue_one already found held.
        fresh = len(requests) > 1
        for start in range(0, len(requests), ENQUEUE_CHUNK):
            # Inputs sharing a live key are one job: the first stands for the rest,
            # which answer its row, deduped.
            end = min(start + ENQUEUE_CHUNK, len(requests))
            followers: list[tuple[int, int]] = []
            chunk_live = live[start:end]
            if len(set(chunk_live)) == end - start:
                pending = list(range(start, end))  # every key its own (C loops only)
            else:
                firsts: dict[Any, int] = {}
                for index, key in enumerate(chunk_live, start):
                    first = firsts.setdefault(key, index)
                    if first != index:
                        followers.append((index, first))
                pending = list(firsts.values())
            params = self._enqueue_params(requests, pending)
            if fresh and len(pending) > 1:
                ((ready, notified),) = await run("enqueue_fresh", params)
                if ready is not None:  # every input inserted its own id
                    ready_queues.update(ready)
                    self._mark_notified(notified)
                    if followers:
                        for index in pending:
                            out[index] = EnqueueResult(ids[index], run_ids[index], False)
                    else:  # pending is start..end: one C-level pass
                        out[start:end] = map(
                            EnqueueResult, ids[start:end], run_ids[start:end], repeat(False)
                        )
                    pending = []
                else:
                    fresh = False
            for _round in range(ENQUEUE_ROUNDS):
                if not pending:
                    break
                rows = await run("enqueue_many", params)
                # Row 0 says which queues got a due row and which were announced;
                # the others name the holders of the inputs that did not insert.
                # Every input not named inserted its own id.
                missing: list[int] = []
                named: set[int] = set()
                for ordinal, found, ready, notified in rows:
                    if ordinal == 0:
                        ready_queues.update(ready or ())
                        self._mark_notified(notified)
                        continue
                    named.add(ordinal)
                    index = pending[ordinal - 1]
                    if found is None:
                        missing.append(index)
                    else:
                        out[index] = EnqueueResult(found[0], found[1], True)
                if named:
                    for ordinal, index in enumerate(pending, start=1):
                        if ordinal not in named:
                            out[index] = EnqueueResult(ids[index], run_ids[index], False)
                else:  # every input inserted (a fresh batch)
                    for index in pending:
                        out[index] = EnqueueResult(ids[index], run_ids[index], False)
                if not missing:
                    break
                pending = missing
                params = self._enqueue_params(requests, pending)
            else:
                raise JobsError(
                    ErrorCode.X_INVARIANT,
                    "enqueue could not settle who holds an idempotency key after "
                    f"{ENQUEUE_ROUNDS} rounds; retry the enqueue",
                )
            for index, first in followers:
                held = out[first]
                assert held is not None
                out[index] = EnqueueResult(held.id, held.run_id, True)
        if ready_queues:
            queues = sorted(ready_queues)
            if after_commit is None:
                self._fire(queues)
            else:
                after_commit.append(lambda: self._fire(queues))
        return [r for r in out if r is not None]

    async def _enqueue_keyed(
        self,
        run: _Run,
        requests: Sequence[EnqueueRequest],
        *,
        after_commit: list[Callable[[], None]] | None,
    ) -> list[EnqueueResult]:
        """Requests of a job declaring ``debounce=`` or ``unique_for=``: one
        statement each, in order (a later input of one key moves the row an
        earlier one inserted)."""
        out: list[EnqueueResult] = []
        ready_queues: set[str] = set()
        for r in requests:
            params = _row_params(r)
            params["debounce"] = r.debounce
            params["unique_for"] = r.unique_for
            for _round in range(ENQUEUE_ROUNDS):
                rows = await run("enqueue_keyed", params)
                if rows:
                    break
            else:
                raise JobsError(
                    ErrorCode.X_INVARIANT,
                    "enqueue could not settle who holds an idempotency key after "
                    f"{ENQUEUE_ROUNDS} rounds; retry the enqueue",
                )
            job_id, run_id, deduped, state = rows[0]
            out.append(EnqueueResult(job_id, run_id, bool(deduped)))
            if state == "ready":
                ready_queues.add(r.queue)
        if ready_queues:
            queues = sorted(ready_queues)
            if after_commit is None:
                self._fire(queues)
            else:
                after_commit.append(lambda: self._fire(queues))
        return out

    async def _enqueue_one(
        self,
        text: _RunText,
        r: EnqueueRequest,
        *,
        after_commit: list[Callable[[], None]] | None,
    ) -> EnqueueResult | None:
        """The single-request fast path: the new row's result, or None when the
        insert met a live key or a known id (nothing was written)."""
        queue = r.queue
        at = self._notified.get(queue)
        allowed = at is None or at + NOTIFY_INTERVAL <= trio.current_time()
        sql, names = positional("enqueue_one")
        now = None if self._clock is None else self._clock.now()
        if names == _ONE_ORDER:
            params = _one_values(r, now=now, channel=self.channel, notify=allowed)
        else:  # the statement's parameters were renamed or reordered
            params = _one_params(r, names, now=now, channel=self.channel, notify=allowed)
        rows = await text(sql, params)
        if not rows:
            return None
        state, notified = rows[0]
        if notified == b"t":
            self._mark_notified([queue])
        if state == b"ready":
            queues = [queue]
            if after_commit is None:
                self._fire(queues)
            else:
                after_commit.append(lambda: self._fire(queues))
        return EnqueueResult(r.id, r.run_id, False)

    def _enqueue_params(
        self, requests: Sequence[EnqueueRequest], pending: Sequence[int]
    ) -> dict[str, Any]:
        """enqueue_many's (and enqueue_fresh's) parameters for the requests at
        ``pending`` (ascending indexes)."""
        if isinstance(requests, EnqueueBatch):
            return self._batch_params(requests, pending)
        return self._request_params([requests[i] for i in pending])

    def _batch_params(self, b: EnqueueBatch, pending: Sequence[int]) -> dict[str, Any]:
        """:meth:`_request_params` of a batch staged as columns, from its columns:
        the shared fields are one parameter by construction; a tenant or
        concurrency key column is one when every row has the same."""
        n = len(pending)
        if n == len(b):  # the whole batch (a chunk of fresh inputs)
            ids, run_ids, payloads, keys = b.ids, b.run_ids, b.payloads, b.idempotency_keys
            tenants, ckeys = b.tenant_ids, b.concurrency_keys
        else:
            ids = [b.ids[i] for i in pending]
            run_ids = [b.run_ids[i] for i in pending]
            payloads = [b.payloads[i] for i in pending]
            keys = [b.idempotency_keys[i] for i in pending]
            tenants = None if b.tenant_ids is None else [b.tenant_ids[i] for i in pending]
            ckeys = None if b.concurrency_keys is None else [b.concurrency_keys[i] for i in pending]
        params: dict[str, Any] = {
            "name": b.name,
            "queue": b.queue,
            "tenant_id": None,
            "concurrency_key": None,
            "max_attempts": b.max_attempts,
            "priority": b.priority,
            "run_at": b.run_at,
            "delay": b.delay,
            "sensitive": b.sensitive,
            "parent_id": None,
            "parent_wait": None,
            "actor": _json_or_none(b.actor),
            "trace_context": _json_or_none(b.trace_context),
        }
        rows = [
            {"ord": i, "id": job_id, "run_id": run_id, "payload": payload, "idempotency_key": key}
            for i, job_id, run_id, payload, key in zip(
                _ordinals(1), ids, run_ids, payloads, keys, strict=False
            )
        ]
        for column, values in (("tenant_id", tenants), ("concurrency_key", ckeys)):
            if values is None:
                continue
            first = values[0]
            if values.count(first) == n:
                params[column] = first
            else:
                for row, value in zip(rows, values, strict=True):
                    row[column] = value
        params["rows"] = _json(rows)
        params["channel"] = self.channel
        params["notify"] = self._notify_allowed([b.queue])
        return params

    def _request_params(self, batch: Sequence[EnqueueRequest]) -> dict[str, Any]:
        # A column the whole batch shares is one parameter; the rows carry only
        # the columns that vary (enqueue_many in sql/queue.sql).
        first = batch[0]
        params: dict[str, Any] = {}
        varying: list[str] = []
        n = len(batch)
        for column in _SHARED_SCALARS:
            value = getattr(first, column)
            values = list(map(attrgetter(column), batch))
            # C-level loops (a column per call, not a generator step per row):
            # one type throughout (True == 1), and every value equal to the first.
            if values.count(value) == n and len(set(map(type, values))) == 1:
                params[column] = value
            else:
                params[column] = None
                varying.append(column)
        for column in _SHARED_JSON:
            value = getattr(first, column)
            values = list(map(attrgetter(column), batch))
            if all(map(is_, values, repeat(value, n))) or len(set(map(_json, values))) == 1:
                params[column] = _json_or_none(value)
            else:
                params[column] = None
                varying.append(column)
        rows = [
            {
                "ord": i,
                "id": r.id,
                "run_id": r.run_id,
                "payload": r.payload,
                "idempotency_key": r.idempotency_key,
            }
            for i, r in enumerate(batch, start=1)
        ]
        if varying:
            for row, r in zip(rows, batch, strict=True):
                for column in varying:
                    row[column] = getattr(r, column)
        params["rows"] = _json(rows)
        params["channel"] = self.channel
        params["notify"] = self._notify_allowed([r.queue for r in batch])
        return params

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_PgTx]:
        async with self.db.transaction() as tx:
            yield _PgTx(self, tx)

    # ------------------------------------------------------------------ claim

    async def claim(self, options: ClaimOptions) -> ClaimResult:
        queues = [q for q in options.queues]
        ttl = self._registry.ttl(options.worker_id)
        # The common case first: no lease has lapsed, nothing to reap
        # (`claim_ready`, a smaller statement). When one has, it takes nothing
        # and answers 'reap', and the full claim, which reaps, runs at once.
        rows = await self._fetch(
            "claim_ready",
            {
                "queues": queues,
                "takes": [int(options.queues[q]) for q in queues],
                "worker_id": options.worker_id,
                "visibility": float(options.visibility_timeout),
                "registry_ttl": ttl,
            },
        )
        if rows and rows[0][0] != "job" and any(r[0] == "reap" for r in rows):
            rows = await self._fetch(
                "claim",
                {
                    "queues": queues,
                    "takes": [int(options.queues[q]) for q in queues],
                    "worker_id": options.worker_id,
                    "visibility": float(options.visibility_timeout),
                    "drop_names": sorted(options.drop_names),
                    "lapse_message": _LAPSE_MESSAGE,
                    "lapsed_line": LAPSED_LINE,
                    "registry_ttl": ttl,
                },
            )
        jobs: list[ClaimedJob] = []
        exhausted: list[Exhausted] = []
        new_job = ClaimedJob
        fence_of = Fence
        step_of = _step_record
        for r in rows:
            kind = r[0]
            if kind == "job":
                # Positional, and no conversions: the columns are already text,
                # int, float8, bool and json (the claim's SELECT); a job's own
                # steps (none for a first run) are the only list built.
                steps = r[25]
                jobs.append(
                    new_job(
                        r[1],
                        r[2],
                        r[3],
                        r[4],
                        r[5],
                        r[6],
                        r[7],
                        r[8],
                        r[9],
                        r[10],
                        fence_of(r[11], r[12]),
                        r[13],
                        r[14],
                        r[15],
                        r[16],
                        r[17],
                        r[18],
                        r[19],
                        [step_of(x) for x in steps] if steps else [],
                    )
                )
            elif kind == "seen":
                self._registry.renewed(options.worker_id, self.now())
            else:
                exhausted.append(
                    Exhausted(
                        id=str(r[1]),
                        run_id=str(r[2]),
                        name=r[3],
                        queue=r[4],
                        payload=r[5],
                        tenant_id=r[6],
                        state=r[20],
                        error_code=r[21],
                        last_error=r[22],
                        attempt=int(r[9]) if r[9] is not None else None,
                    )
                )
        return ClaimResult(jobs=jobs, exhausted=exhausted)

    # ------------------------------------------------------------------ settle

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        """The fenced completion. Concurrent acks from many slots share one
        statement (the settle combiner); each returns once its row is committed.

        A settle whose call raised (a dropped connection: the statement may have
        committed, its answer lost) is remembered, and the next settle of the
        same claim is sent as a retry (``again``): it answers ``True`` when that
        claim's settle already landed, without moving anything twice. A second
        settle after a clean answer is still refused."""
        key = (job_id, options.fence.claim)
        again = self._unsure.pop(key, False)
        try:
            return await self._acker.submit((job_id, ""), (job_id, options, again))
        except BaseException:
            self._mark_unsure(key)
            raise

    async def _ack_many(self, acks: Sequence[tuple[str, AckOptions]]) -> builtins.list[bool]:
        """The batched ack (:class:`_PgAcks`): one ``ack_many`` statement for
        the batch, each claim's ``again`` flag as :meth:`ack` keeps it."""
        self.db  # noqa: B018 — a closed driver refuses at once
        unsure = self._unsure
        batch: builtins.list[tuple[str, AckOptions, bool]] = [
            (job_id, o, unsure.pop((job_id, o.fence.claim), False) if unsure else False)
            for job_id, o in acks
        ]
        try:
            if len({job_id for job_id, _ in acks}) == len(acks):
                landed = await self._flush_acks(batch)
                return [i in landed for i in range(1, len(batch) + 1)]
            # A job twice (a stale claim's ack beside its new claim's): one row is
            # written once per statement, so each goes in a statement of its own.
            answers: builtins.list[bool] = []
            for item in batch:
                answers.append(1 in await self._flush_acks([item]))
            return answers
        except BaseException:
            for job_id, o, _again in batch:
                self._mark_unsure((job_id, o.fence.claim))
            raise

    def _mark_unsure(self, key: tuple[str, int]) -> None:
        self._unsure[key] = True
        if len(self._unsure) > UNSURE_KEPT:
            del self._unsure[next(iter(self._unsure))]

    async def _flush_acks(self, batch: builtins.list[tuple[str, AckOptions, bool]]) -> set[int]:
        rows: builtins.list[dict[str, Any]] = []
        for i, (job_id, o, again) in enumerate(batch, start=1):
            # Only the keys that carry a value (an absent key reads as NULL):
            # built directly, one dict a row, on the hot path of every ack.
            row: dict[str, Any] = {
                "ord": i,
                "id": job_id,
                "worker_id": o.fence.worker_id,
                "claim": o.fence.claim,
            }
            if o.result is not None:
                row["result"] = _json(o.result)
            if o.progress is not None:
                row["progress"] = _progress_json(o.progress)
            if o.duration is not None:
                row["duration"] = o.duration
            if again:
                row["again"] = True
            rows.append(row)
        found = await self._fetch(self._ack_query, {"rows": _json(rows)})
        # A released slot made the first run waiting on its key due: wake this
        # process's idle workers on that queue (the others find it at their poll).
        self._fire(sorted({r[1] for r in found if r[1] is not None}))
        return {int(r[0]) for r in found}

    async def _flush_steps(self, batch: builtins.list[tuple[str, Fence, StepRecord]]) -> set[int]:
        found = await self._fetch("steps_put_many", {"rows": _step_rows(batch)})
        return {int(r[0]) for r in found}

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        """The fenced hand-back; a retry after a call that raised recognises a
        hand-back that already landed, as :meth:`ack` does."""
        key = (job_id, options.fence.claim)
        again = self._unsure.pop(key, False)
        try:
            return await self._nack(job_id, options, again)
        except BaseException:
            self._mark_unsure(key)
            raise

    async def _nack(self, job_id: str, options: NackOptions, again: bool) -> bool:
        if options.wait_children and options.children_wait and options.state == "suspended":
            # Suspended on its children: the hand-back and the wait's mark (or,
            # every child having settled since the run read them, the run made
            # due now) in one transaction, so no crash can leave a parent
            # suspended on a wait whose last settle will not wake it.
            wait = options.children_wait
            async with self.db.transaction() as tx:

                async def run(name: str, params: Mapping[str, Any]) -> list[Row]:
                    return await tx.execute(query(name), {"now": self._now_param(), **params})

                landed = await self._nack_in(run, job_id, options, again)
                if not landed:
                    return False
                due = await run(
                    "children_wait", {"id": job_id, "wait": wait, "channel": self.channel}
                )
            if due and due[0][0] is not None:
                self._fire([str(due[0][0])])
            return True
        return await self._nack_in(self._fetch, job_id, options, again)

    async def _nack_in(self, run: _Run, job_id: str, options: NackOptions, again: bool) -> bool:
        final = options.state in ("dead", "failed")
        rows = await run(
            "nack",
            {
                "id": job_id,
                "again": again,
                "worker_id": options.fence.worker_id,
                "claim": options.fence.claim,
                "counted": options.counted,
                "max_attempts": options.max_attempts,
                "progress": _progress_json(options.progress),
                "set_error": options.error_code is not None or options.last_error is not None,
                "error_code": options.error_code,
                "last_error": options.last_error,
                "state": options.state,
                "final": final,
                "run_at": options.run_at,
                "delay": options.delay,
                "waiting_event": options.waiting_event,
                "busy_key": options.busy_key if options.state == "ready" else None,
                "c_retried": 1 if (not final and options.counted) else 0,
                "c_failed": 1 if options.state == "failed" else 0,
                "c_dead": 1 if options.state == "dead" else 0,
                "duration": options.duration,
                "channel": self.channel,
                "quiet": self._quiet_queues(),
                "outcome": nack_outcome(options),
                "attempt_code": options.error_code,
                "attempt_error": first_line(options.last_error),
            },
        )
        if not rows or not rows[0][0]:
            return False
        _count, notified, queue, run_at, now, freed = rows[0]
        if notified:
            self._mark_notified([queue])
        if freed or (not final and run_at is not None and float(run_at) <= float(now)):
            # due now, or a released slot made the first run waiting on its key due
            self._fire([queue])
        return True

    async def release_orphans(self, worker_id: str, held: frozenset[int]) -> list[str]:
        rows = await self._fetch(
            "release_orphans",
            {
                "worker_id": worker_id,
                "held": sorted(held),
                "message": ORPHAN_MESSAGE,
                "line": first_line(ORPHAN_MESSAGE),
            },
        )
        if rows:
            self._fire(sorted({str(r[1]) for r in rows}))
        return [str(r[0]) for r in rows]

    async def heartbeat(
        self, requests: Sequence[HeartbeatRequest], visibility_timeout: float
    ) -> list[str]:
        if not requests:
            self.db  # noqa: B018 — a closed driver refuses even an empty call
            return []
        rows = await self._fetch(
            "heartbeat",
            {
                "ids": [r.job_id for r in requests],
                "worker_ids": [r.fence.worker_id for r in requests],
                "claims": [r.fence.claim for r in requests],
                "progress": [_progress_json(r.progress) for r in requests],
                "steps": [r.step.name if r.step is not None else None for r in requests],
                "step_since": [r.step.started_at if r.step is not None else None for r in requests],
                "visibility": float(visibility_timeout),
            },
        )
        statuses = [HeartbeatStatus.LOST] * len(requests)
        for ordinal, status in rows:
            statuses[int(ordinal) - 1] = str(status)
        return statuses

    async def attempt_log(self, job_id: str) -> list[AttemptRecord]:
        key = _uuid_or_none(job_id)
        if key is None:
            self.db  # noqa: B018 — a closed driver refuses even a malformed id
            return []
        rows = await self._fetch("attempt_log", {"id": key})
        return attempt_records(rows[0][0]) if rows else []

    async def stats(self) -> list[QueueStats]:
        rows = await self._fetch("stats", {})
        counts: dict[str, dict[str, int]] = {}
        for queue, state, count in rows:
            counts.setdefault(queue, {})[state] = int(count)
        return [QueueStats(queue=q, **c) for q, c in sorted(counts.items())]


class _PgTx:
    """The app's transaction, Trio-side: ``execute`` runs app SQL; enqueues and
    publishes join it and commit or vanish with it."""

    def __init__(self, driver: PostgresDriver, tx: Transaction) -> None:
        self._driver = driver
        self._tx = tx

    async def _run(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        return await self._tx.execute(query(name), {"now": self._driver._now_param(), **params})

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        return await self._driver._enqueue(
            self._run, requests, after_commit=self._tx.after_commit, text=self._tx.fetch_text
        )

    async def publish(self, name: str, payload: Any) -> None:
        rows = await self._run(
            "publish", {"name": name, "payload": _json(payload), "channel": self._driver.channel}
        )
        woken = list(rows[0][2] or []) if rows else []
        if woken:
            self._tx.after_commit.append(lambda: self._driver._fire(woken))

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        return await self._tx.execute(sql, params if params else None)

    async def put_step(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        # The fence check takes FOR SHARE on the job row, held until this
        # transaction ends: no settle or reap can move the row before the commit.
        rows = await self._run("steps_put_many", {"rows": _step_rows([(job_id, fence, record)])})
        return bool(rows)


# --------------------------------------------------------------------------- steps


def _step_rows(batch: Sequence[tuple[str, Fence, StepRecord]]) -> str:
    """Step records as the JSON array ``steps_put_many`` takes: only the keys
    that carry a value (an absent key reads as NULL), each row built directly
    (one dict a record, on the path of every step)."""
    rows: builtins.list[dict[str, Any]] = []
    for i, (job_id, fence, r) in enumerate(batch, start=1):
        row: dict[str, Any] = {
            "ord": i,
            "job_id": job_id,
            "worker_id": fence.worker_id,
            "claim": fence.claim,
            "name": r.name,
            "status": r.status,
            "seq": r.seq,
            "executions": r.executions,
        }
        if r.output is not None:
            row["output"] = _json(r.output)
        if r.started_at is not None:
            row["started_at"] = r.started_at
        if r.ended_at is not None:
            row["ended_at"] = r.ended_at
        for key in _STEP_SPARSE:
            value = getattr(r, key)
            if value is not None:
                row[key] = value
        rows.append(row)
    return _json(rows)


#: StepRecord fields a completed step.run leaves None (each sent when set).
_STEP_SPARSE = ("error", "error_code", "wake_at", "event", "since", "deadline")


class _PgAcks:
    """The driver's :class:`~trio_jobs.drivers.AckBatches`: a worker's ack
    pipeline sends the acks its slots finished as one ``ack_many`` statement."""

    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver

    async def ack_many(self, acks: Sequence[tuple[str, AckOptions]]) -> builtins.list[bool]:
        return await self._d._ack_many(acks)


def _step_record(r: Sequence[Any]) -> StepRecord:
    return StepRecord(
        name=r[0],
        status=r[1],
        seq=int(r[2]),
        executions=int(r[3]),
        output=r[4],
        error=r[5],
        error_code=r[6],
        wake_at=r[7],
        event=r[8],
        since=r[9],
        deadline=r[10],
        started_at=r[11],
        ended_at=r[12],
    )


class _PgSteps:
    #: A put outlives a cancel of its caller, bounded by the step writer's budget.
    shielded = True

    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver

    async def load(self, job_id: str) -> list[StepRecord]:
        rows = await self._d._fetch("steps_load", {"job_id": job_id})
        return [_step_record(r) for r in rows]

    async def put(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        return await self._d._step_writer.submit_shielded(
            (job_id, record.name), (job_id, fence, record)
        )

    async def children(self, ids: Sequence[str]) -> builtins.list[ChildState]:
        if not ids:
            self._d.db  # noqa: B018 — a closed driver refuses even an empty read
            return []
        rows = await self._d._fetch("children", {"ids": list(ids)})
        found = {r[0]: ChildState(r[0], r[1], r[2], r[3]) for r in rows}
        return [found.get(i) or ChildState(i, "cancelled", None, ErrorCode.X_ABORTED) for i in ids]


# --------------------------------------------------------------------------- events


class _PgEvents:
    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver

    async def publish(self, name: str, payload: Any) -> None:
        rows = await self._d._fetch(
            "publish", {"name": name, "payload": _json(payload), "channel": self._d.channel}
        )
        woken = list(rows[0][2] or []) if rows else []
        self._d._fire(woken)

    async def poll(self, name: str, since: float) -> tuple[list[EventRecord], float]:
        rows = await self._d._fetch("poll", {"name": name, "since": since})
        now = float(rows[0][0])
        found = [EventRecord(int(r[1]), r[2], r[3], float(r[4])) for r in rows if r[1] is not None]
        return found, now


# --------------------------------------------------------------------------- rate limits


class _PgRateLimits:
    """Rate limits in a table every process of the fleet reaches: one upsert
    per acquisition (``rate_acquire``, rate.sql), on the database's clock."""

    #: One table for the fleet.
    shared = True

    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver

    async def acquire(self, name: str, key: str, limit: int, per: float) -> RateGrant:
        rows = await self._d._fetch(
            "rate_acquire",
            {
                "name": name,
                "key": key,
                "limit": int(limit),
                "per": float(per),
                "exact": exact_wait(limit, per),
            },
        )
        granted, wait = rows[0]
        return RateGrant(True) if granted else RateGrant(False, float(wait))


# --------------------------------------------------------------------------- leases


class _PgLeases:
    #: A release makes the first run waiting on its key due (trio_jobs_wake_waiter).
    wakes_waiters = True

    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver

    async def acquire(
        self, lease_key: str, limit: int, job_id: str, fence: Fence, ttl: float
    ) -> LeaseGrant:
        for _round in range(limit + 2):
            rows = await self._d._fetch(
                "lease_acquire",
                {
                    "key": lease_key,
                    "limit": int(limit),
                    "job_id": job_id,
                    "worker_id": fence.worker_id,
                    "claim": fence.claim,
                    "ttl": float(ttl),
                },
            )
            mine, taken, free, holders, all_own = rows[0]
            if mine is not None:
                return LeaseGrant(slot=int(mine))
            if taken is not None:
                return LeaseGrant(slot=int(taken))
            if free is None:
                return LeaseGrant(slot=None, own=bool(holders) and bool(all_own))
            # A free slot was taken by a racing worker between our read and our
            # insert: look again.
        return LeaseGrant(slot=None, own=False)

    async def release(self, job_id: str) -> None:
        await self._d._fetch("lease_release", {"job_id": job_id})

    async def held(self, lease_key: str) -> int:
        rows = await self._d._fetch("lease_held", {"key": lease_key})
        return int(rows[0][0])


# --------------------------------------------------------------------------- introspection


def _not_found() -> JobsError:
    return JobsError(
        ErrorCode.X_JOB_NOT_FOUND,
        "no job has that id; list jobs with `trio-jobs list` to find it",
    )


def _decode(cursor: str) -> tuple[float, str]:
    mark_at, mark_id = decode_cursor(cursor)
    checked = _uuid_or_none(mark_id)
    if checked is None:
        decode_cursor("!")  # raises the page error, worded once in the memory driver
    return mark_at, str(checked)


#: The first and last ids a prefix can start: padding a prefix with either bounds
#: the ids that start with it.
_ZERO_ID = "00000000-0000-0000-0000-000000000000"
_LAST_ID = "ffffffff-ffff-ffff-ffff-ffffffffffff"


def _uuid_or_none(job_id: str) -> str | None:
    import uuid

    try:
        return str(uuid.UUID(str(job_id)))
    except ValueError:
        return None


class _Registry:
    """What this process last wrote to the worker registry, per worker id.

    An idle worker records itself every heartbeat interval (a third of the
    ttl) with the same info, and claims every few seconds. The claim statement
    renews the live row's liveness (``seen`` in ``claim``), so a record whose
    info is unchanged, while a claim or a record renewed the row less than half
    a ttl ago, needs no statement: the row is as fresh as that write would make
    it. Anything else (new info, a row gone or expired, no claim lately) writes.
    """

    def __init__(self) -> None:
        self._rows: dict[str, tuple[tuple[Any, ...], float, float]] = {}

    def ttl(self, worker_id: str) -> float | None:
        row = self._rows.get(worker_id)
        return row[1] if row is not None else None

    def renewed(self, worker_id: str, now: float) -> None:
        row = self._rows.get(worker_id)
        if row is not None:
            self._rows[worker_id] = (row[0], row[1], now)

    def recorded(self, worker_id: str, key: tuple[Any, ...], ttl: float, now: float) -> None:
        self._rows[worker_id] = (key, ttl, now)

    def unchanged(self, worker_id: str, key: tuple[Any, ...], now: float) -> bool:
        row = self._rows.get(worker_id)
        return row is not None and row[0] == key and now - row[2] < row[1] / 2

    def forget(self, worker_id: str) -> None:
        self._rows.pop(worker_id, None)


class _PgIntrospection:
    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver
        # Where the sweep under way stopped: its cut-offs, then the last done
        # row (created_at, id) and the last other row's updated_at it deleted.
        self._purge_cursor: tuple[tuple[float, float], Any, Any, Any] | None = None

    @staticmethod
    def _view(r: Row, steps: Sequence[StepView] = (), log: Sequence[AttemptRecord] = ()) -> JobView:
        return JobView(
            id=str(r[0]),
            run_id=str(r[1]),
            name=r[2],
            queue=r[3],
            state=r[4],
            attempts=int(r[5]),
            max_attempts=int(r[6]),
            tenant_id=r[7],
            idempotency_key=r[8],
            concurrency_key=r[9],
            run_at=float(r[10]),
            created_at=float(r[11]),
            error_code=r[12],
            last_error=r[13],
            progress=_progress(r[14]),
            result=r[15],
            steps=list(steps),
            payload=r[16],
            priority=int(r[17]),
            updated_at=float(r[18]) if r[18] is not None else None,
            worker_id=r[19],
            sensitive=r[20],
            attempt_log=tuple(log),
        )

    @staticmethod
    def _step_views(rows: Sequence[Row]) -> Sequence[StepView]:
        return [
            StepView(r[0], r[1], int(r[2]), r[3], r[4], started_at=r[5], ended_at=r[6])
            for r in rows
        ]

    async def _show_in(self, run: _Run, job_id: str) -> JobView:
        rows = await run("show", {"id": job_id})
        if not rows:
            raise _not_found()
        steps = await run("show_steps", {"id": job_id})
        view = self._view(rows[0], self._step_views(steps), attempt_records(rows[0][21]))
        return attrs.evolve(view, parent_id=rows[0][22], children=tuple(rows[0][23] or ()))

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[_Run]:
        async with self._d.db.transaction() as tx:

            async def run(name: str, params: Mapping[str, Any]) -> list[Row]:
                return await tx.execute(query(name), {"now": self._d._now_param(), **params})

            yield run

    async def _locked_row(self, run: _Run, job_id: str) -> Row:
        rows = await run("show_for_update", {"id": job_id})
        if not rows:
            raise _not_found()
        return rows[0]

    async def show(self, job_id: str) -> JobView:
        key = _uuid_or_none(job_id)
        if key is None:
            self._d.db  # noqa: B018
            raise _not_found()
        return await self._show_in(self._d._fetch, key)

    async def resolve_id(self, prefix: str) -> str:
        low = prefix + _ZERO_ID[len(prefix) :]
        high = prefix + _LAST_ID[len(prefix) :]
        if _uuid_or_none(low) is None or _uuid_or_none(high) is None:
            self._d.db  # noqa: B018
            raise _not_found()  # not the start of a canonical id: no job's
        rows = await self._d._fetch(
            "resolve_prefix", {"low": low, "high": high, "limit": AMBIGUOUS_SHOWN + 1}
        )
        ids = [str(r[0]) for r in rows]
        return resolved_prefix(ids[:AMBIGUOUS_SHOWN], len(ids))

    async def list(self, filter: ListFilter) -> JobPage:
        f = filter  # validated where it was built (ListFilter's validators)
        self._d.db  # noqa: B018
        params: dict[str, Any] = {
            "queue": f.queue,
            "name": f.name,
            "state": f.state,
            "tenant_id": f.tenant_id,
            "id_prefix": f.id_prefix.lower() if f.id_prefix is not None else None,
            "created_from": f.created_from,
            "created_to": f.created_to,
            "limit": f.limit + 1,
        }
        if f.before is not None:
            mark_at, mark_id = _decode(f.before)
            rows = await self._d._fetch(
                "list_newer", {**params, "mark_at": mark_at, "mark_id": mark_id}
            )
            has_prev = len(rows) > f.limit
            page = list(reversed(rows[: f.limit]))
            has_more = True
        else:
            mark_at_o: float | None = None
            mark_id_o: str | None = None
            if f.after is not None:
                mark_at_o, mark_id_o = _decode(f.after)
            rows = await self._d._fetch(
                "list_older", {**params, "mark_at": mark_at_o, "mark_id": mark_id_o}
            )
            has_more = len(rows) > f.limit
            page = rows[: f.limit]
            has_prev = f.after is not None
        views = [self._view(r) for r in page]
        after = encode_cursor(views[-1].created_at, views[-1].id) if views and has_more else None
        before = encode_cursor(views[0].created_at, views[0].id) if views and has_prev else None
        return JobPage(rows=views, after=after, before=before)

    async def requeue(self, job_id: str, from_step: str | None = None) -> JobView:
        key = _uuid_or_none(job_id)
        if key is None:
            self._d.db  # noqa: B018
            raise _not_found()
        queue: str | None = None
        try:
            async with self._tx() as run:
                row = await self._locked_row(run, key)
                state = row[4]
                if state in LIVE_STATES:
                    raise JobsError(
                        ErrorCode.X_JOB_NOT_REQUEUEABLE,
                        f"the job is {state}; only a done, failed, dead or cancelled job can "
                        "be requeued",
                    )
                holder = await run(
                    "live_holder", {"name": row[2], "key": row[8], "tenant_id": row[7]}
                )
                if holder and str(holder[0][0]) != key:
                    raise _duplicate(str(holder[0][0]))
                if from_step is not None:
                    cut = await run("steps_cut", {"id": key, "step": from_step})
                    if not cut:
                        raise JobsError(
                            ErrorCode.X_INVARIANT,
                            "the job recorded no step by that name; `trio-jobs show ID` lists "
                            "its steps",
                        )
                moved = await run("requeue_row", {"id": key})
                queue = moved[0][0]
                view = await self._show_in(run, key)
        except psycopg.errors.UniqueViolation:
            # A live row took the key between our check and our move.
            raise _duplicate(None) from None
        if queue is not None:
            self._d._fire([queue])
        return view

    async def cancel(self, job_id: str, reason: str | None = None) -> JobView:
        key = _uuid_or_none(job_id)
        if key is None:
            self._d.db  # noqa: B018
            raise _not_found()
        last_error = f"{ErrorCode.X_ABORTED}: cancelled" + (f": {reason}" if reason else "")
        async with self._tx() as run:
            # The job and its live descendants, locked in id order first: a
            # cancelled parent cancels its live children (and theirs).
            family = await run("lock_family", {"id": key})
            row = await self._locked_row(run, key)
            if row[4] not in LIVE_STATES:
                raise JobsError(
                    ErrorCode.X_JOB_NOT_CANCELLABLE,
                    f"the job already ended {row[4]}; only a live job can be cancelled",
                )
            await run(
                "cancel_row",
                {"id": key, "last_error": last_error, "line": CANCELLED_LINE},
            )
            if len(family) > 1:
                await run(
                    "cancel_descendants",
                    {
                        "id": key,
                        "last_error": f"{ErrorCode.X_ABORTED}: cancelled: its parent was cancelled",
                        "line": "cancelled: its parent was cancelled",
                    },
                )
            return await self._show_in(run, key)

    async def remove(self, job_id: str) -> None:
        key = _uuid_or_none(job_id)
        if key is None:
            self._d.db  # noqa: B018
            raise _not_found()
        async with self._tx() as run:
            row = await self._locked_row(run, key)
            if row[4] == "running":
                raise JobsError(
                    ErrorCode.X_JOB_NOT_REMOVABLE,
                    "the job is running; cancel it first (`trio-jobs cancel ID`), then remove it",
                )
            await run("remove_row", {"id": key})

    @staticmethod
    def _bulk_params(f: BulkFilter) -> dict[str, Any]:
        return {
            "state": f.state,
            "queue": f.queue,
            "name": f.name,
            "tenant_id": f.tenant_id,
            "bound": MAX_BULK_ROWS,
        }

    async def remove_many(self, filter: BulkFilter) -> BulkResult:
        self._d.db  # noqa: B018
        check_bulk_action("remove", filter)
        params = self._bulk_params(filter)
        async with self._tx() as run:
            total = int((await run("count_matching", params))[0][0])
            affected = int((await run("remove_many", params))[0][0])
        return BulkResult(affected=affected, remaining=max(0, total - affected))

    async def requeue_many(self, filter: BulkFilter) -> BulkResult:
        self._d.db  # noqa: B018
        check_bulk_action("requeue", filter)
        params = self._bulk_params(filter)
        async with self._tx() as run:
            moved_rows = await run("requeue_many", params)
            remaining = int((await run("requeue_many_remaining", params))[0][0])
        affected = int(moved_rows[0][0])
        self._d._fire(list(moved_rows[0][1] or []))
        return BulkResult(affected=affected, remaining=remaining)

    async def promote(self, job_id: str) -> JobView:
        key = _uuid_or_none(job_id)
        if key is None:
            self._d.db  # noqa: B018
            raise _not_found()
        async with self._tx() as run:
            row = await self._locked_row(run, key)
            moved = await run("promote_row", {"id": key})
            if not moved:
                raise JobsError(
                    ErrorCode.X_INVARIANT,
                    f"the job is {row[4]} and not waiting on its run_at; only a delayed job, "
                    "or a ready one backing off before a retry, can be promoted",
                )
            view = await self._show_in(run, key)
        self._d._fire([view.queue])
        return view

    async def promote_many(self, filter: BulkFilter) -> BulkResult:
        self._d.db  # noqa: B018
        check_bulk_action("promote", filter)
        rows = await self._d._fetch("promote_many", self._bulk_params(filter))
        affected, total, queues = int(rows[0][0]), int(rows[0][1]), list(rows[0][2] or [])
        self._d._fire(queues)
        return BulkResult(affected=affected, remaining=max(0, total - affected))

    async def preview_many(
        self, action: BulkAction, filter: BulkFilter, sample: int
    ) -> BulkPreview:
        self._d.db  # noqa: B018
        check_bulk_action(action, filter)
        params = {**self._bulk_params(filter), "sample": sample}
        async with self._tx() as run:
            count, ids = (await run(f"preview_{action}", params))[0]
            rows = await run("preview_rows", {"ids": [str(i) for i in ids]}) if ids else []
        return BulkPreview(count=int(count), sample=[self._view(r) for r in rows])

    async def resolve_step(self, job_id: str, step: str, *, ran: bool, output: Any = None) -> None:
        key = _uuid_or_none(job_id)
        if key is None:
            self._d.db  # noqa: B018
            raise _not_found()
        async with self._tx() as run:
            row = await self._locked_row(run, key)
            if row[4] == "running":
                raise JobsError(
                    ErrorCode.X_INVARIANT,
                    "the job is running; resolve its step once it has stopped",
                )
            rec = await run("step_get", {"id": key, "step": step})
            if not rec or rec[0][0] not in ("started", "failed"):
                raise JobsError(
                    ErrorCode.X_INVARIANT,
                    "only a `once` step whose outcome is unknown (started or failed) can be "
                    "resolved",
                )
            if ran:
                await run("step_resolve_ran", {"id": key, "step": step, "output": _json(output)})
            else:
                await run("step_resolve_not_ran", {"id": key, "step": step})

    async def pause_queue(self, queue: str) -> None:
        await self._d._fetch("pause_queue", {"queue": queue})

    async def resume_queue(self, queue: str) -> None:
        await self._d._fetch("resume_queue", {"queue": queue, "channel": self._d.channel})
        self._d._fire([queue])

    async def paused_queues(self) -> builtins.list[str]:
        return [r[0] for r in await self._d._fetch("paused_queues", {})]

    async def record_worker(self, info: WorkerInfo, ttl: float) -> None:
        registry = self._d._registry
        key = (
            info.host,
            int(info.pid),
            float(info.started_at),
            tuple(info.queues),
            tuple(sorted(info.slots.items())),
            tuple(info.in_flight),
            float(ttl),
        )
        if registry.unchanged(info.id, key, self._d.now()):
            self._d.db  # noqa: B018 — a closed driver refuses even a skipped record
            await trio.lowlevel.checkpoint()
            return
        await self._d._fetch(
            "record_worker",
            {
                "id": info.id,
                "host": info.host,
                "pid": int(info.pid),
                "started_at": float(info.started_at),
                "queues": list(info.queues),
                "slots": _json(dict(info.slots)),
                "in_flight": list(info.in_flight),
                "ttl": float(ttl),
            },
        )
        registry.recorded(info.id, key, float(ttl), self._d.now())

    async def remove_worker(self, worker_id: str) -> None:
        self._d._registry.forget(worker_id)
        await self._d._fetch("remove_worker", {"id": worker_id})

    async def workers(self) -> builtins.list[WorkerInfo]:
        rows = await self._d._fetch("workers", {})
        return [
            WorkerInfo(
                id=r[0],
                host=r[1],
                pid=int(r[2]),
                started_at=float(r[3]),
                queues=list(r[4]),
                slots=dict(r[5]),
                in_flight=list(r[6]),
                last_heartbeat=float(r[7]),
            )
            for r in rows
        ]

    async def purge(self, done_before: float, dead_before: float, limit: int) -> int:
        # A call with the cut-offs of the call before, which filled its batch,
        # is the next batch of one sweep: it starts after the rows that went.
        cut = (float(done_before), float(dead_before))
        cursor = self._purge_cursor
        after = cursor[1:] if cursor is not None and cursor[0] == cut else (None, None, None)
        self._purge_cursor = None
        rows = await self._d._fetch(
            "purge_jobs",
            {
                "done_before": cut[0],
                "dead_before": cut[1],
                "limit": int(limit),
                "after_created": after[0],
                "after_id": after[1],
                "after_updated": after[2],
            },
        )
        removed, created, job_id, updated = rows[0]
        if removed >= limit:
            self._purge_cursor = (
                cut,
                after[0] if created is None else created,
                after[1] if job_id is None else job_id,
                after[2] if updated is None else updated,
            )
        return int(removed)

    async def counters(self, name: str | None, since: float) -> builtins.list[CounterRow]:
        rows = await self._d._fetch("counters", {"name": name, "since": float(since)})
        return [
            CounterRow(
                float(r[0]),
                r[1],
                int(r[2]),
                int(r[3]),
                int(r[4]),
                int(r[5]),
                float(r[6]),
                queue=r[7],
            )
            for r in rows
        ]


def _duplicate(holder: str | None) -> JobsError:
    who = f" ({holder})" if holder else ""
    return JobsError(
        ErrorCode.X_JOB_DUPLICATE,
        f"a live job{who} holds this job's idempotency key; wait for it to settle",
        meta={"holder": holder} if holder else None,
    )
