"""The Redis driver: the second durable driver, on coredis (anyio, so it runs on
Trio with no bridge).

Same semantics as the memory driver (the reference). Every change that touches
more than one key is one Lua script (``lua/queue.lua``), atomic by itself:
``enqueue_many`` is one script call per 1,000 requests, ``claim`` one call (the
reap included), the acks of every slot one fenced call a batch (the worker's
ack pipeline over ``acks.ack_many``, or the settle combiner,
``drivers/_combine.py``, for an ``ack`` awaited by its slot) that also moves the
counters and frees the rows' keys and concurrency slots, each hand-back one call, ``heartbeat`` one call for every
held row. The operator surface is ``_introspect.py`` (``lua/operate.lua``). Due times and leases are decided with the server's clock (``TIME`` inside
the scripts); a test may pass a ``clock`` whose now is sent with every call
instead.
"""

from __future__ import annotations

import builtins
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import coredis
import coredis.exceptions
import orjson
import trio

from ..._serialization import dumps, loads
from ..._time import Clock, SystemClock
from ...errors import DriverError, ErrorCode, JobsError
from ...logging import emit
from .._attempt_log import attempt_records
from .._combine import BATCH, Combiner
from .._protocol import (
    ENQUEUE_CHUNK,
    ORPHAN_MESSAGE,
    AckBatches,
    AckOptions,
    AttemptRecord,
    ChildState,
    ClaimedJob,
    ClaimOptions,
    ClaimResult,
    CounterRow,
    EnqueueRequest,
    EnqueueResult,
    EventRecord,
    Exhausted,
    Fence,
    HeartbeatRequest,
    LeaseGrant,
    NackOptions,
    Progress,
    QueueStats,
    RateGrant,
    RateLimitStore,
    StepRecord,
    first_line,
    nack_outcome,
)
from .._service import ServiceTasks
from .._window import exact_wait
from ._backfills import RedisBackfills
from ._client import Scripts, connect, not_connected, translate
from ._introspect import RedisIntrospection
from ._lane import ScriptLane, lane_for
from ._scripts import SCRIPT_NAMES, script_source
from ._tasks import RedisTasks
from ._wake import RedisWake

__all__ = ["SCHEMA_VERSION", "RedisDriver"]

logger = logging.getLogger("trio_jobs.redis")

#: The layout of the keys this driver writes. Stored under ``<prefix>:schema``
#: on first open; a driver speaking another version refuses to open, except
#: that older keys are upgraded in place: version 1's are indexed (see
#: ``_upgrade``), version 2's need nothing (version 3 keeps a run's newest
#: attempt entry in fields of its own, and still closes an entry version 2 left
#: open in the JSON log; the version moves so a version-2 process, which would
#: not see those fields, refuses to open beside it).
SCHEMA_VERSION = 3
#: The most acks one ``ack`` script call carries from :meth:`RedisDriver._ack_many`
#: (the combiner's batch: a call holds the single-threaded server for its rows).
ACK_CALL = BATCH
#: The most settles remembered as possibly landed (their call raised) until the
#: same claim settles again; the oldest is forgotten first.
UNSURE_KEPT = 10_000

_LAPSE_MESSAGE = (
    f"{ErrorCode.X_JOB_LEASE_LOST}: the lease lapsed on the final attempt "
    f"(%d of %d); the worker holding it died or stopped renewing it — "
    f"{ErrorCode.X_JOB_MAX_ATTEMPTS}"
)

_TERMINAL_FIELDS = ("done", "failed", "dead", "cancelled")
#: The longest duration the scripts store (their MAX_DURATION: 100 years).
MAX_DURATION_SECONDS = 3_155_760_000


def _s(value: Any) -> str:
    """A reply element as text (``None`` stays ``None``)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _opt(value: str | None) -> str:
    """An optional script argument: ``''`` is none, ``'=' + value`` is a value."""
    return "" if value is None else "=" + value


def _num(value: float | None) -> str:
    return "" if value is None else "=" + repr(float(value))


def _json(value: Any) -> str:
    return dumps(value).decode()


def _json_opt(value: Any) -> str:
    return "" if value is None else "=" + _json(value)


def _progress_opt(progress: Progress | None) -> str:
    if progress is None:
        return ""
    return "=" + _json({"done": progress.done, "total": progress.total, "note": progress.note})


def _progress(value: Any) -> Progress | None:
    if not value:
        return None
    data = loads(value)
    return Progress(float(data["done"]), float(data["total"]), data.get("note"))


def _score(value: float) -> str:
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return repr(float(value))


def live_field(name: str, tenant_id: str | None, key: str) -> str:
    """The live-key index field of ``(name, tenant_id, idempotency_key)``.

    JSON of the triple: unambiguous for any strings, and ``None`` (no tenant)
    differs from every tenant string."""
    return _json([name, tenant_id, key])


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


def _step_argv(job_id: str, fence: Fence, record: StepRecord) -> list[str]:
    """One fenced step write as the scripts take it (``step_put``, and each staged
    put of a transaction's commit)."""
    return [
        job_id,
        fence.worker_id,
        str(int(fence.claim)),
        record.name,
        str(int(record.seq)),
        _step_body(record),
    ]


def _step_body(record: StepRecord) -> str:
    return _json(
        {
            "status": record.status,
            "executions": record.executions,
            "output": record.output,
            "error": record.error,
            "error_code": record.error_code,
            "wake_at": record.wake_at,
            "event": record.event,
            "since": record.since,
            "deadline": record.deadline,
            "started_at": record.started_at,
            "ended_at": record.ended_at,
        }
    )


def _steps_from(flat: Sequence[Any]) -> list[StepRecord]:
    records = []
    for name, value in _pairs(flat).items():
        seq, _, body = value.partition("\n")
        records.append(_step_record(name, int(seq), loads(body)))
    records.sort(key=lambda r: r.seq)
    return records


def _step_record(name: str, seq: int, data: Mapping[str, Any]) -> StepRecord:
    """One step record from its stored JSON body (see :func:`_step_body`)."""
    return StepRecord(
        name=name,
        status=data["status"],
        seq=seq,
        executions=int(data.get("executions") or 0),
        output=data.get("output"),
        error=data.get("error"),
        error_code=data.get("error_code"),
        wake_at=data.get("wake_at"),
        event=data.get("event"),
        since=data.get("since"),
        deadline=data.get("deadline"),
        started_at=data.get("started_at"),
        ended_at=data.get("ended_at"),
    )


def _claimed(r: list[Any], fence: Fence) -> ClaimedJob:
    """One row of the claim script's JSON reply (see its ``taken``): numbers
    arrive as JSON numbers; ``fence`` is the row's (built by the caller, which
    knows the worker)."""
    return ClaimedJob(
        id=r[0],
        run_id=r[1],
        name=r[2],
        queue=r[3],
        payload=r[4],
        tenant_id=r[5],
        idempotency_key=r[6],
        concurrency_key=r[7],
        attempt=r[8],
        max_attempts=r[9],
        fence=fence,
        created_at=r[12],
        run_at=r[13],
        lease_expires_at=r[14],
        actor=r[15],
        trace_context=r[16],
        promoted=r[17] == 1,
        lapsed=r[18] == 1,
        steps=[
            _step_record(name, int(seq), data)
            for name, seq, data in sorted(r[19], key=lambda s: int(s[1]))
        ]
        if r[19]
        else [],
    )


#: The fields of a row's attempt log: ``al`` (a JSON array of the older
#: entries), then the newest entry in fields of its own while it is open or
#: closed done (queue.lua, ``log_push``).
ATTEMPT_FIELDS = ("al", "oa", "ow", "on", "os", "ost", "oe")


def _attempts_from(row: Mapping[str, Any]) -> list[AttemptRecord]:
    """A row's attempt log fields (:data:`ATTEMPT_FIELDS`; times as strings) →
    records, oldest first."""
    raw = row.get("al")
    data: list[Any] = []
    if raw:
        found = loads(_s(raw))
        if isinstance(found, list):  # cjson writes an empty table as {}
            data = found
    started = row.get("oa")
    if started is not None:
        entry: dict[str, Any] = {
            "attempt": _s(row["on"]),
            "worker_id": _s(row["ow"]),
            "started_at": _s(started),
        }
        if row.get("os") is not None:
            entry["step"] = _s(row["os"])
            entry["step_started_at"] = _s(row["ost"])
        if row.get("oe") is not None:
            entry["ended_at"] = _s(row["oe"])
            entry["outcome"] = "done"
        data = [*data, entry]
    return attempt_records(data)


def unavailable(what: str) -> DriverError:
    """``X_DRIVER_UNAVAILABLE`` for a call the driver cannot send (it is closed,
    or its pool did not start): nothing was sent."""
    return not_connected(what)


def _check_duration(duration: float | None) -> None:
    """A settle's duration as the scripts take it (refused here, before it
    joins a combined call that one bad value would refuse whole)."""
    if duration is not None and not (
        math.isfinite(duration) and 0 <= duration <= MAX_DURATION_SECONDS
    ):
        raise JobsError(
            ErrorCode.X_INVARIANT,
            "the duration must be a number of seconds from 0 to 100 years; nothing was written",
        )


def _request_row(r: EnqueueRequest) -> list[str]:
    """One request as the 20 script arguments ``insert_row`` reads."""
    return [
        r.id,
        r.run_id,
        r.name,
        r.queue,
        _json(r.payload),
        _opt(r.tenant_id),
        r.idempotency_key,
        _opt(r.concurrency_key),
        str(int(r.max_attempts)),
        str(int(r.priority)),
        _num(r.run_at),
        _num(r.delay),
        _json_opt(dict(r.actor) if r.actor is not None else None),
        _json_opt(dict(r.trace_context) if r.trace_context is not None else None),
        live_field(r.name, r.tenant_id, r.idempotency_key),
        "1" if r.sensitive else "0",
        _opt(r.parent_id),
        _num(r.debounce),
        _num(r.unique_for),
        _opt(r.parent_wait),
    ]


class RedisDriver:
    """The Redis driver. See :func:`~trio_jobs.drivers.redis.redis_driver`."""

    name = "redis"
    #: How often a waiting run re-checks for its event when the job declares no
    #: ``event_poll`` (the protocol's default).
    event_poll_default = 30.0

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = "trio_jobs",
        clock: Clock | None = None,
        connect_timeout: float = 1.0,
        stream_timeout: float = 10.0,
        max_connections: int = 64,
        done_retention: float = 14 * 86400.0,
        dead_retention: float = 90 * 86400.0,
    ) -> None:
        if not prefix or any(c in prefix for c in "{}\n"):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "prefix must be a non-empty string without braces or newlines",
            )
        self._url_arg = url
        self.prefix = prefix
        self._clock = clock
        self._connect_timeout = connect_timeout
        self._stream_timeout = stream_timeout
        self._max_connections = max_connections
        #: 0: no done row is kept (the ack script deletes it; done_retention=0).
        self._done_ttl = float(done_retention)
        #: False: a job that settles done is deleted by its ack (done_retention=0).
        self.keep_done = self._done_ttl != 0
        self._dead_ttl = float(dead_retention)
        self._system = SystemClock()
        self._skew = 0.0
        self._client: coredis.Redis[str] | None = None
        self._scripts: Scripts | None = None
        #: The script calls' own connections (``_lane.py``; None: through coredis).
        self._lane: ScriptLane | None = None
        self._shas: dict[str, str] = {}
        self._url = ""
        self._service = ServiceTasks("redis", logger)
        self.steps = _RedisSteps(self)
        self.events = _RedisEvents(self)
        self.leases: _RedisLeases | None = _RedisLeases(self)
        self.rate_limits: RateLimitStore | None = _RedisRateLimits(self)
        #: The operator surface (``lua/operate.lua``): ``jobs.show``/``list``/
        #: ``cancel``/..., the CLI and the dashboard.
        self.introspect: RedisIntrospection | None = RedisIntrospection(self)
        self.backfills: RedisBackfills | None = RedisBackfills(self)
        #: Scheduled tasks: leases, fires and pauses (lua/tasks.lua).
        self.tasks: RedisTasks | None = RedisTasks(self)
        #: The batched ack the worker's ack pipeline hands its slots' acks to
        #: (one ``ack`` script call a batch; see :class:`_RedisAcks`).
        self.acks: AckBatches | None = _RedisAcks(self)
        self.wake: RedisWake | None = RedisWake(
            subscribe=self._subscribe,
            send_probe=self._send_probe,
            start=self._start_service_task,
        )
        self._acker = Combiner(
            self._flush_acks,
            lambda: self.client,
            lambda: unavailable("the driver closed with the settle in flight"),
            exit_error=lambda: unavailable("the driver closed with the settle in flight"),
        )
        # Settles whose call raised (the script may have run, its reply lost):
        # the next settle of the same claim is a retry (see ack).
        self._unsure: dict[tuple[str, int], bool] = {}
        self.opened = False
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def channel(self) -> str:
        """The pub/sub channel the wake listens on."""
        return f"{self.prefix}:wake"

    @property
    def url(self) -> str:
        """The URL in use (after :meth:`open`)."""
        return self._url

    @property
    def client(self) -> coredis.Redis[str]:
        if self._client is None or self.closed or not self._service.running:
            raise unavailable("the driver is not open: enter it with open_jobs(...)")
        return self._client

    def _resolve_url(self) -> str:
        url = self._url_arg or os.environ.get("REDIS_URL")
        if not url:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "redis_driver() needs a URL: redis_driver('redis://host:6379/0') or REDIS_URL",
            )
        return url

    async def open(self) -> None:
        """Open outside ``open_jobs``: the connection pool and the wake session
        run in a Trio system task until :meth:`close` (the fallback; ``open_jobs``
        uses :meth:`open_in`)."""
        await self._open(None)

    @asynccontextmanager
    async def open_in(self, nursery: trio.Nursery) -> AsyncIterator[None]:
        """Open for the block, the connection pool and the wake session in a
        task of ``nursery``; leaving the block closes the driver."""
        await self._open(nursery)
        try:
            yield
        finally:
            await self.close()

    async def _open(self, nursery: trio.Nursery | None) -> None:
        if self.opened and not self.closed:
            return
        url = self._resolve_url()
        try:
            client = connect(
                url,
                connect_timeout=self._connect_timeout,
                stream_timeout=self._stream_timeout,
                max_connections=self._max_connections,
            )
        except (ValueError, TypeError, coredis.exceptions.RedisError):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "the Redis URL does not parse; pass redis://[:password@]host:port/db "
                "(rediss:// for TLS, unix:///path for a socket)",
            ) from None
        self._url = url
        self._client = client
        self._scripts = Scripts(client)
        self._lane = lane_for(
            url,
            connect_timeout=self._connect_timeout,
            stream_timeout=self._stream_timeout,
            max_connections=self._max_connections,
        )
        if self._lane is not None:
            self._shas = {name: self._lane.sha(script_source(name)) for name in SCRIPT_NAMES}
        self.closed = False
        await self._start_service(client, nursery)
        try:
            # Loaded up front, so a first call pays no NOSCRIPT round trip.
            for source in self._scripts.sources():
                await self._call(self.client.script_load(source), "SCRIPT LOAD")
            stored = await self._script("schema", [str(SCHEMA_VERSION)])
            if int(_s(stored)) == 1:
                stored = await self._upgrade()
            if int(_s(stored)) == 2:
                stored = await self._script("schema_set", ["2", str(SCHEMA_VERSION)])
            if int(_s(stored)) != SCHEMA_VERSION:
                raise JobsError(
                    ErrorCode.X_CONFIG_INVALID,
                    f"the keys under prefix {self.prefix!r} were written with key-schema "
                    f"version {_s(stored)}, and this trio-jobs speaks version {SCHEMA_VERSION}; "
                    "run the trio-jobs version that wrote them until their jobs have settled, "
                    "or point this driver at an empty database or another prefix "
                    "(redis_driver(url, prefix=...))",
                    meta={"stored": _s(stored), "expected": SCHEMA_VERSION},
                )
            await self._measure_skew()
            await self._check_eviction()
            if self.wake is not None:
                self.wake.reset()
        except BaseException:
            await self._stop_service()
            self._close_lane()
            self._client = None
            raise
        self.opened = True

    async def _upgrade(self) -> Any:
        """Version 1's keys to version 2's: every row into the operator
        surface's indexes (by creation and by id), then the stored version moves
        to 2 (and :meth:`open` moves it on).
        Rows are found by ``SCAN`` in batches; a row written meanwhile by a
        version-1 process may be missed (stop them first: the how-to says so).
        Idempotent: an upgrade cut short is simply run again."""
        client = self.client
        batch: list[str] = []
        start = len(self.prefix) + len(":job:")

        async def flush() -> None:
            if batch:
                await self._script("schema_index", batch)
                batch.clear()

        async for key in client.scan_iter(match=f"{self.prefix}:job:*", count=1000):
            batch.append(_s(key)[start:])
            if len(batch) >= 500:
                await flush()
        await flush()
        return await self._script("schema_set", ["1", "2"])

    async def _check_eviction(self) -> None:
        """Warn when Redis may evict keys: under memory pressure an eviction
        policy deletes job rows silently. Best effort (a managed server may
        refuse CONFIG GET)."""
        try:
            reply = await self._call(self.client.config_get(["maxmemory-policy"]), "CONFIG GET")
        except JobsError:
            return
        policy = _s(reply.get("maxmemory-policy", "noeviction"))
        if policy != "noeviction":
            emit(
                logger,
                logging.WARNING,
                "jobs.redis.eviction",
                policy=policy,
                hint="set maxmemory-policy noeviction: any other policy may delete "
                "queued jobs and step records when Redis runs out of memory",
            )

    async def _measure_skew(self) -> None:
        if self._clock is not None:
            return
        before = self._system.now()
        reply = await self._call(self.client.time(), "TIME")
        after = self._system.now()
        self._skew = reply.timestamp() - (before + after) / 2

    async def _start_service(
        self, client: coredis.Redis[str], nursery: trio.Nursery | None
    ) -> None:
        """Hold the client's connection pool (and the wake session) in
        ``nursery``, else a system task (see :class:`ServiceTasks`)."""
        if not await self._service.start(self._acker.run, context=client, nursery=nursery):
            raise unavailable("the connection pool did not start")

    def _start_service_task(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._service.spawn(fn, lambda: unavailable("the driver is not open"))

    async def _stop_service(self) -> None:
        await self._service.stop()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self._stop_service()
        self._close_lane()
        self._client = None

    def _close_lane(self) -> None:
        if self._lane is not None:
            self._lane.close()
            self._lane = None

    def now(self) -> float:
        if self._clock is not None:
            return self._clock.now()
        return self._system.now() + self._skew

    # ------------------------------------------------------------------ calls

    async def _call(self, request: Awaitable[Any], what: str) -> Any:
        """Await one command, translating the client's failures at the boundary
        (:func:`~._client.translate`, the one place they map to codes)."""
        try:
            return await request
        except (coredis.exceptions.RedisError, TimeoutError, OSError, RuntimeError) as exc:
            raise translate(exc, what) from None

    async def _script(self, name: str, args: Sequence[str]) -> Any:
        """Call script ``name`` (coredis reloads it once on ``NOSCRIPT``)."""
        full = [
            self.prefix,
            "" if self._clock is None else repr(float(self._clock.now())),
            repr(self._done_ttl),
            repr(self._dead_ttl),
            *args,
        ]
        self.client  # noqa: B018 — a closed driver refuses before the call is built
        if self._lane is not None:
            return await self._call(self._lane.call(self._shas[name], full), name)
        assert self._scripts is not None
        return await self._call(self._scripts.call(name, full), name)

    async def _send_probe(self, token: str) -> None:
        await self._call(self.client.publish(self.channel, token), "PUBLISH")

    @asynccontextmanager
    async def _subscribe(self) -> AsyncIterator[Any]:
        client = self.client
        if self._lane is not None:
            async with self._lane.subscribe(self.channel) as messages:
                yield messages
            return
        async with client.pubsub(
            channels=[self.channel], ignore_subscribe_messages=True, retry_policy=None
        ) as pubsub:
            yield pubsub

    def _fire(self, queues: Sequence[str]) -> None:
        if queues and self.wake is not None:
            self.wake.fire(list(queues))

    # ------------------------------------------------------------------ enqueue

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        self.client  # noqa: B018 — refuse a closed driver before any work
        out: list[EnqueueResult] = []
        ready: set[str] = set()
        now = self.now()
        for start in range(0, len(requests), ENQUEUE_CHUNK):
            chunk = requests[start : start + ENQUEUE_CHUNK]
            args = [str(len(chunk))]
            for r in chunk:
                args.extend(_request_row(r))
            reply = await self._script("enqueue", args)
            for r, (found_id, found_run, deduped) in zip(chunk, reply, strict=True):
                out.append(EnqueueResult(_s(found_id), _s(found_run), bool(int(deduped))))
                if (
                    not int(deduped)
                    and not r.delay
                    and r.debounce is None
                    and (r.run_at is None or r.run_at <= now)
                ):
                    ready.add(r.queue)
        self._fire(sorted(ready))
        return out

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_RedisTx]:
        self.client  # noqa: B018
        tx = _RedisTx(self)
        yield tx
        await tx.commit()

    # ------------------------------------------------------------------ claim

    async def claim(self, options: ClaimOptions) -> ClaimResult:
        drops = sorted(options.drop_names)
        args = [
            options.worker_id,
            repr(float(options.visibility_timeout)),
            _LAPSE_MESSAGE,
            str(len(drops)),
            *drops,
        ]
        for queue, take in options.queues.items():
            args.extend([queue, str(int(take))])
        taken, buried, next_due = await self._script("claim", args)
        worker = options.worker_id
        jobs = [_claimed(r, Fence(worker, r[11])) for r in orjson.loads(taken)]
        exhausted = [
            Exhausted(
                id=_s(b[0]),
                run_id=_s(b[1]),
                name=_s(b[2]),
                queue=_s(b[3]),
                payload=loads(_s(b[4])),
                tenant_id=_s(b[5]) if b[5] is not None else None,
                state="failed" if _s(b[6]) == "failed" else "dead",
                error_code=_s(b[7]),
                last_error=_s(b[8]),
            )
            for b in buried
        ]
        return ClaimResult(
            jobs=jobs,
            exhausted=exhausted,
            next_due=float(_s(next_due)) if next_due else math.inf,
        )

    # ------------------------------------------------------------------ settle

    def _settle_again(self, job_id: str, fence: Fence) -> str:
        """The script's ``again`` flag for a settle of ``fence``: ``'1'`` when the
        last settle of that claim raised (its reply may have been lost after the
        script ran), so this one is a retry."""
        if not self._unsure:  # the common case: nothing raised lately
            return ""
        return "1" if self._unsure.pop((job_id, int(fence.claim)), False) else ""

    def _mark_unsure(self, job_id: str, fence: Fence) -> None:
        self._unsure[(job_id, int(fence.claim))] = True
        if len(self._unsure) > UNSURE_KEPT:
            del self._unsure[next(iter(self._unsure))]

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        """The fenced completion. Concurrent acks from many slots share one
        script call (the settle combiner, ``drivers/_combine.py``); each returns once
        its row is settled. A retry after a call that raised answers ``True``
        when this claim's settle already landed (the script keeps the settling
        claim), moving nothing twice; after a clean answer a second settle is
        still refused."""
        _check_duration(options.duration)
        again = self._settle_again(job_id, options.fence)
        try:
            return await self._acker.submit(job_id, (job_id, options, again))
        except BaseException:
            self._mark_unsure(job_id, options.fence)
            raise

    async def _ack_many(self, acks: Sequence[tuple[str, AckOptions]]) -> list[bool]:
        """The batched ack (:class:`_RedisAcks`): one ``ack`` script call for up
        to ``ACK_CALL`` acks (the script settles its rows in order, so a job twice
        in a batch, a stale claim's ack beside its new claim's, is settled as two
        calls would), each claim's ``again`` flag as :meth:`ack` keeps it."""
        self.client  # noqa: B018 — a closed driver refuses at once
        for _job_id, options in acks:
            _check_duration(options.duration)
        unsure = self._unsure
        batch = [
            (job_id, o, ("1" if unsure.pop((job_id, int(o.fence.claim)), False) else ""))
            if unsure
            else (job_id, o, "")
            for job_id, o in acks
        ]
        answers: list[bool] = []
        try:
            for start in range(0, len(batch), ACK_CALL):
                part = batch[start : start + ACK_CALL]
                landed = await self._flush_acks(part)
                answers.extend(i in landed for i in range(1, len(part) + 1))
        except BaseException:
            for job_id, o, _again in batch:
                self._mark_unsure(job_id, o.fence)
            raise
        return answers

    async def _flush_acks(self, batch: list[tuple[str, AckOptions, str]]) -> set[int]:
        # Seven plain arguments a settle: the script reads them as they come,
        # with no JSON to decode (a table a settle, on the server's one thread).
        settles: list[str] = []
        add = settles.extend
        for job_id, options, again in batch:
            fence, result, progress, duration = (
                options.fence,
                options.result,
                options.progress,
                options.duration,
            )
            add(
                (
                    job_id,
                    fence.worker_id,
                    str(int(fence.claim)),
                    "" if result is None else "=" + _json(result),
                    "" if progress is None else _progress_opt(progress),
                    "" if duration is None else "=" + repr(float(duration)),
                    again,
                )
            )
        landed = await self._script("ack", settles)
        if len(landed) != len(batch):
            raise JobsError(
                ErrorCode.X_INVARIANT,
                f"the ack script answered {len(landed)} settles for {len(batch)} sent; "
                "this is a bug in the Redis driver",
            )
        return {i for i, x in enumerate(landed, start=1) if int(x)}

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        """The fenced hand-back; a retry recognises its landed hand-back as
        :meth:`ack` does."""
        again = self._settle_again(job_id, options.fence)
        try:
            return await self._nack(job_id, options, again)
        except BaseException:
            self._mark_unsure(job_id, options.fence)
            raise

    async def _nack(self, job_id: str, options: NackOptions, again: str) -> bool:
        set_err = options.error_code is not None or options.last_error is not None
        landed = await self._script(
            "nack",
            [
                job_id,
                options.fence.worker_id,
                str(int(options.fence.claim)),
                options.state,
                "1" if options.counted else "0",
                "" if options.max_attempts is None else f"={int(options.max_attempts)}",
                _progress_opt(options.progress),
                "1" if set_err else "0",
                _opt(options.error_code),
                _opt(options.last_error),
                _num(options.run_at),
                _num(options.delay),
                _opt(options.waiting_event),
                _num(options.duration),
                again,
                _opt(options.busy_key if options.state == "ready" else None),
                nack_outcome(options),
                options.error_code or "",
                first_line(options.last_error) or "",
                "1" if options.wait_children else "0",
                _opt(options.children_wait),
            ],
        )
        if not int(landed[0]):
            return False
        if int(landed[2]):
            self._fire([_s(landed[1])])  # due now: this process's waiters need no round trip
        return True

    async def release_orphans(self, worker_id: str, held: frozenset[int]) -> list[str]:
        reply = await self._script(
            "release_orphans",
            [
                worker_id,
                ORPHAN_MESSAGE,
                first_line(ORPHAN_MESSAGE) or "",
                *(str(c) for c in sorted(held)),
            ],
        )
        return [_s(x) for x in reply]

    async def heartbeat(
        self, requests: Sequence[HeartbeatRequest], visibility_timeout: float
    ) -> list[str]:
        if not requests:
            self.client  # noqa: B018 — a closed driver refuses even an empty call
            return []
        args = [repr(float(visibility_timeout)), str(len(requests))]
        for r in requests:
            args.extend(
                [
                    r.job_id,
                    r.fence.worker_id,
                    str(int(r.fence.claim)),
                    _progress_opt(r.progress),
                    r.step.name if r.step is not None else "",
                    repr(float(r.step.started_at)) if r.step is not None else "",
                ]
            )
        reply = await self._script("heartbeat", args)
        return [_s(x) for x in reply]

    async def attempt_log(self, job_id: str) -> list[AttemptRecord]:
        got = await self._call(
            self.client.hmget(f"{self.prefix}:job:{job_id}", ATTEMPT_FIELDS), "HMGET"
        )
        return _attempts_from(dict(zip(ATTEMPT_FIELDS, got, strict=True)))

    async def stats(self) -> list[QueueStats]:
        reply = await self._script("stats", [])
        out = []
        for row in reply:
            queue = _s(row[0])
            counts = {k: int(v) for k, v in _pairs(row[1]).items()}
            rest = row[2:]
            for i in range(0, len(rest), 2):
                counts[_s(rest[i])] = int(rest[i + 1])
            fields = {k: max(0, v) for k, v in counts.items() if v}
            if fields:
                out.append(QueueStats(queue=queue, **fields))
        out.sort(key=lambda s: s.queue)
        return out

    # ------------------------------------------------------------------ queue pauses, counters

    async def pause_queue(self, queue: str) -> None:
        """Stop every worker claiming from ``queue`` (from each one's next claim);
        enqueues still land. Redis-only: the driver has no operator surface."""
        await self._call(self.client.sadd(f"{self.prefix}:paused", [queue]), "SADD")

    async def resume_queue(self, queue: str) -> None:
        """Let workers claim from ``queue`` again, and announce it."""
        await self._call(self.client.srem(f"{self.prefix}:paused", [queue]), "SREM")
        await self._call(self.client.publish(self.channel, queue), "PUBLISH")
        self._fire([queue])

    async def paused_queues(self) -> list[str]:
        """The paused queues, sorted."""
        members = await self._call(self.client.smembers(f"{self.prefix}:paused"), "SMEMBERS")
        return sorted(_s(m) for m in members)

    async def counters(self, name: str | None, since: float) -> builtins.list[CounterRow]:
        """History per job name in one-minute buckets at or after ``since`` (kept
        31 days), moved by the settling scripts themselves."""
        reply = await self._script("counters", [name or "", _score(since)])
        merged: dict[tuple[float, str], list[float]] = {}
        queues: dict[tuple[float, str], str] = {}
        for bucket, flat in reply:
            for field, value in _pairs(flat).items():
                job, _, what = field.rpartition("\n")
                if name is not None and job != name:
                    continue
                key = (float(_s(bucket)), job)
                cell = merged.setdefault(key, [0, 0, 0, 0, 0.0])
                if what == "queue":
                    queues[key] = value
                    continue
                index = ("done", "retried", "failed", "dead", "duration").index(what)
                cell[index] += float(value)
        return [
            CounterRow(
                b, n, int(c[0]), int(c[1]), int(c[2]), int(c[3]), c[4], queue=queues.get((b, n))
            )
            for (b, n), c in sorted(merged.items())
        ]


class _RedisAcks:
    """The driver's :class:`~trio_jobs.drivers.AckBatches`: a worker's ack
    pipeline sends the acks its slots finished as one ``ack`` script call."""

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def ack_many(self, acks: Sequence[tuple[str, AckOptions]]) -> builtins.list[bool]:
        return await self._d._ack_many(acks)


class _RedisTx:
    """A driver-side transaction, MULTI-like: enqueues and publishes are
    buffered and applied together by one script on commit.

    Each staged enqueue is answered at once: inputs sharing a key with an
    earlier one in the transaction are that row, deduped; the others are asked
    of the server (a read-only script) and dedupe onto a live holder there.
    At commit the rows answered as new are written, and the events published,
    in one script; if another enqueue took one of their keys in between, nothing
    is applied and the commit raises ``X_INVARIANT`` (retry the transaction)."""

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver
        self._rows: list[EnqueueRequest] = []
        self._keys: dict[str, EnqueueResult] = {}
        self._events: list[tuple[str, str]] = []
        self._steps: list[list[str]] = []
        self._debounced: list[EnqueueRequest] = []

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        out: list[EnqueueResult | None] = [None] * len(requests)
        ask: list[int] = []
        firsts: dict[str, int] = {}
        for i, r in enumerate(requests):
            lf = live_field(r.name, r.tenant_id, r.idempotency_key)
            staged = self._keys.get(lf)
            if staged is not None:
                out[i] = EnqueueResult(staged.id, staged.run_id, True)
                self._debounce(r)
            elif lf in firsts:
                continue
            else:
                firsts[lf] = i
                ask.append(i)
        for start in range(0, len(ask), ENQUEUE_CHUNK):
            chunk = ask[start : start + ENQUEUE_CHUNK]
            args = [str(len(chunk))]
            for i in chunk:
                r = requests[i]
                args.extend(
                    [
                        live_field(r.name, r.tenant_id, r.idempotency_key),
                        r.id,
                        "" if r.unique_for is None else repr(float(r.unique_for)),
                    ]
                )
            reply = await self._d._script("peek", args)
            for i, found in zip(chunk, reply, strict=True):
                r = requests[i]
                lf = live_field(r.name, r.tenant_id, r.idempotency_key)
                if found:
                    result = EnqueueResult(_s(found[0]), _s(found[1]), True)
                    self._debounce(r)
                else:
                    result = EnqueueResult(r.id, r.run_id, False)
                    self._rows.append(r)
                self._keys[lf] = EnqueueResult(result.id, result.run_id, True)
                out[i] = result
        for i, r in enumerate(requests):
            if out[i] is None:
                first = self._keys[live_field(r.name, r.tenant_id, r.idempotency_key)]
                out[i] = EnqueueResult(first.id, first.run_id, True)
                self._debounce(r)
        return [r for r in out if r is not None]

    def _debounce(self, r: EnqueueRequest) -> None:
        """A debounced input answered as deduped: the commit moves the row
        holding its key (staged here, or live on the server) with it."""
        if r.debounce is None:
            return
        lf = live_field(r.name, r.tenant_id, r.idempotency_key)
        for staged in self._rows:
            if live_field(staged.name, staged.tenant_id, staged.idempotency_key) == lf:
                # A row this transaction writes: it takes the last input itself.
                index = self._rows.index(staged)
                self._rows[index] = attrs.evolve(
                    staged,
                    payload=r.payload,
                    concurrency_key=r.concurrency_key,
                    debounce=r.debounce,
                )
                return
        self._debounced.append(r)

    async def publish(self, name: str, payload: Any) -> None:
        self._events.append((name, _json(payload)))

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            "the Redis driver runs no SQL; keep app writes in the app's database and "
            "stage jobs through an outbox (open_jobs(..., outbox=...)) for atomicity with them",
        )

    async def put_step(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        # Staged: the commit script checks the fence and applies nothing when it
        # no longer holds (X_JOB_LEASE_LOST from commit).
        self._steps.append(_step_argv(job_id, fence, record))
        return True

    async def commit(self) -> None:
        if not self._rows and not self._events and not self._steps and not self._debounced:
            return
        args = [str(len(self._rows))]
        for r in self._rows:
            args.extend(_request_row(r))
        args.append(str(len(self._events)))
        for name, payload in self._events:
            args.extend([name, payload])
        args.append(str(len(self._steps)))
        for step in self._steps:
            args.extend(step)
        args.append(str(len(self._debounced)))
        for r in self._debounced:
            args.extend(_request_row(r))
        reply = await self._d._script("commit", args)
        if isinstance(reply, str | bytes) and _s(reply) == "conflict":
            raise JobsError(
                ErrorCode.X_INVARIANT,
                "another enqueue took an idempotency key this transaction staged, between "
                "the staging and the commit; nothing of the transaction was applied — retry it",
            )
        if isinstance(reply, str | bytes) and _s(reply) == "lost":
            raise JobsError(
                ErrorCode.X_JOB_LEASE_LOST,
                "the job's lease lapsed before the step's transaction committed; "
                "nothing of it was applied",
            )
        self._d._fire([_s(q) for q in reply])


class _RedisSteps:
    #: A put is cancellable: the step write shields it.
    shielded = False

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def children(self, ids: Sequence[str]) -> list[ChildState]:
        """The children's states, one script call; an id no row holds (removed,
        or expired) reads as ``cancelled``."""
        d = self._d
        if not ids:
            d.client  # noqa: B018 — a closed driver refuses even an empty call
            return []
        out: list[ChildState] = []
        for job_id, row in zip(ids, await d._script("children", list(ids)), strict=True):
            if not row:
                out.append(ChildState(job_id, "cancelled", None, ErrorCode.X_ABORTED))
                continue
            result = loads(_s(row[1])) if row[1] else None
            code = _s(row[2]) if row[2] else None
            out.append(ChildState(job_id, _s(row[0]), result, code))  # type: ignore[arg-type]
        return out

    async def load(self, job_id: str) -> list[StepRecord]:
        d = self._d
        flat = await d._call(d.client.hgetall(f"{d.prefix}:steps:{job_id}"), "HGETALL")
        items: list[Any] = []
        for k, v in flat.items():
            items.extend([k, v])
        return _steps_from(items)

    async def put(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        landed = await self._d._script("step_put", _step_argv(job_id, fence, record))
        return bool(int(landed))


class _RedisEvents:
    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def publish(self, name: str, payload: Any) -> None:
        woke = await self._d._script("publish", [name, _json(payload)])
        self._d._fire([_s(q) for q in woke])

    async def poll(self, name: str, since: float) -> tuple[list[EventRecord], float]:
        now, flat = await self._d._script("poll", [name, _score(since)])
        found = []
        for i in range(0, len(flat), 2):
            eid, _, body = _s(flat[i]).partition("\n")
            found.append(EventRecord(int(eid), name, loads(body), float(_s(flat[i + 1]))))
        found.sort(key=lambda e: e.id)
        return found, float(_s(now))


class _RedisLeases:
    """Fleet-wide slot counting: one key per held slot, written by a script that
    checks every slot of the lease key at once. A slot is free when unset or
    when its holder's expiry (in the value, on the server's clock) has passed;
    the key's own TTL only collects garbage."""

    #: A release makes the first run waiting on its key due (``wake_waiter``).
    wakes_waiters = True

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def acquire(
        self, lease_key: str, limit: int, job_id: str, fence: Fence, ttl: float
    ) -> LeaseGrant:
        slot, own = await self._d._script(
            "lease_acquire",
            [lease_key, str(int(limit)), job_id, fence.worker_id, str(int(fence.claim)), repr(ttl)],
        )
        if int(slot) < 0:
            return LeaseGrant(slot=None, own=bool(int(own)))
        return LeaseGrant(slot=int(slot))

    async def release(self, job_id: str) -> None:
        await self._d._script("lease_release", [job_id])

    async def held(self, lease_key: str) -> int:
        return int(await self._d._script("lease_held", [lease_key]))


class _RedisRateLimits:
    """Rate limits in keys every process of the fleet reaches: one script call
    per acquisition (``rate_acquire``), a sorted set per window, on the server's
    clock."""

    #: One server for the fleet.
    shared = True

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def acquire(self, name: str, key: str, limit: int, per: float) -> RateGrant:
        granted, wait = await self._d._script(
            "rate_acquire",
            [name, key, str(int(limit)), repr(float(per)), repr(exact_wait(limit, per))],
        )
        return RateGrant(True) if int(granted) else RateGrant(False, float(_s(wait)))


__all__ += ["live_field", "unavailable"]
