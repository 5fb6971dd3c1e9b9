"""psycopg 3 under Trio: the one module that knows how.

psycopg is built as a core of non-blocking generators (send a query, read a
result, each step yielding "wait until the socket is readable/writable") plus
a *wait function* per concurrency model: a blocking one for the sync API and
an asyncio one for the async API. This module supplies the third: a Trio wait
function, installed by overriding :meth:`psycopg.AsyncConnection.wait`, so every
psycopg operation (``execute``, ``fetch*``, ``set_autocommit``, COPY, pipelines)
runs natively on Trio's I/O loop. No asyncio loop runs and nothing here imports
``asyncio``.

Why not trio-asyncio around psycopg's asyncio API and psycopg-pool? Measured on
this machine (loopback PostgreSQL 15, ``select 1`` per call, 4,000 calls):

================================  ===========  ============================
approach                          1 task       16 concurrent tasks
================================  ===========  ============================
trio-asyncio + psycopg-pool       253 us/call  387 us/call  (2,580 calls/s)
asyncio thread + from_thread      356 us/call  238 us/call  (4,200 calls/s)
sync psycopg in trio.to_thread    269 us/call  240 us/call  (4,160 calls/s)
**Trio wait function (this)**     **98 us**    **52 us/call (19,000 calls/s)**
================================  ===========  ============================

(Measured while the driver was built; ``tests/drivers/postgres/bench_driver.py``
times the driver's own calls.) The Trio wait function is also the integration
psycopg's author pointed Trio users at (psycopg issue #29).

What this module owns:

* :func:`connect` — libpq's non-blocking connect (``PGconn.connect_start`` and
  ``connect_poll``) driven on Trio, host names resolved in a worker thread.
* :class:`TrioConnection` — an ``AsyncConnection`` whose ``wait`` awaits
  ``trio.lowlevel.wait_readable/wait_writable``. Cancelling the Trio scope
  around a query sends a cancel request to the server, drains the connection
  (shielded, bounded) and re-raises ``trio.Cancelled``; a connection that cannot
  be drained is closed, never returned to the pool in an unknown state.
* :class:`Pool` — a small Trio pool of autocommit connections.
* :class:`Database` — what the driver calls: one statement per call
  (:meth:`Database.fetch`), or a whole transaction (:meth:`Database.transaction`).
* :func:`unavailable` — psycopg's connection failures (a lost connection, an
  admin shutdown, a failover) become ``JobsError("X_DRIVER_UNAVAILABLE")`` at
  this boundary, and :func:`conflict` turns a deadlock (SQLSTATE ``40P01``) or a
  serialization failure (``40001``) into ``JobsError("X_DRIVER_CONFLICT")``: the
  server rolled the statement's transaction back, so it is safe to run again.

The psycopg names this module relies on are public (no ``psycopg._*`` module, no
``_``-prefixed name) and are pinned, with their signatures, by
``tests/drivers/postgres/test_psycopg_seam.py``: the psycopg versions CI runs
(the oldest supported and the newest) must pass it, and pyproject.toml caps
psycopg below its next minor until that release has passed it too. The one
method of psycopg's this module overrides is ``AsyncConnection.wait(gen,
interval, timeout)``: psycopg calls it with every generator it drives.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import select
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import psycopg.waiting
import trio
from psycopg import pq
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo
from psycopg.types.json import set_json_loads

from ...errors import DriverError, ErrorCode
from ...logging import emit
from ._sql import qualify, quote_ident

__all__ = [
    "Database",
    "Pool",
    "TrioConnection",
    "WaitTimeout",
    "conflict",
    "connect",
    "translate",
    "unavailable",
]

logger = logging.getLogger("trio_jobs.postgres")

RV = TypeVar("RV")
_R = TypeVar("_R")
_P = TypeVar("_P")
Params = Sequence[Any] | Mapping[str, Any] | None
Row = tuple[Any, ...]

_WAIT_R = psycopg.waiting.Wait.R
_WAIT_W = psycopg.waiting.Wait.W
_WAIT_RW = psycopg.waiting.Wait.RW
_READY_R = psycopg.waiting.Ready.R
_READY_W = psycopg.waiting.Ready.W
_ACTIVE = pq.TransactionStatus.ACTIVE
_IDLE = pq.TransactionStatus.IDLE
_CONN_OK = pq.ConnStatus.OK
_CONN_BAD = pq.ConnStatus.BAD
_POLL_OK = pq.PollingStatus.OK
_POLL_READING = pq.PollingStatus.READING
_POLL_WRITING = pq.PollingStatus.WRITING
_POLL_FAILED = pq.PollingStatus.FAILED
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR

#: After how many runs psycopg prepares a statement on the server (its default),
#: where preparing is allowed.
PREPARE_THRESHOLD = 5

#: How long calls must succeed with none failing before an outage is over.
RECOVERED_AFTER = 1.0

#: How long a cancelled query may take to drain (and a rollback to land) before
#: the connection is closed instead.
CANCEL_GRACE = 5.0


class WaitTimeout(psycopg.OperationalError):
    """:meth:`TrioConnection.wait` ran out of its ``timeout`` (psycopg passes one
    only from ``notifies(timeout=...)``, which this package does not use: the
    wake reads the LISTEN session's socket itself)."""


def unavailable(exc: BaseException | None = None, what: str = "PostgreSQL") -> DriverError:
    """The ``X_DRIVER_UNAVAILABLE`` error for a connection failure.

    The message names the exception class and SQLSTATE only: a libpq message may
    carry a host, a user or (for a bad DSN) a password fragment."""
    kind = type(exc).__name__ if exc is not None else "no connection"
    state = getattr(exc, "sqlstate", None)
    detail = f"{kind}" + (f", SQLSTATE {state}" if state else "")
    return DriverError(
        ErrorCode.X_DRIVER_UNAVAILABLE,
        f"could not reach {what} ({detail}); check the DSN or DATABASE_URL and that the "
        "server is up — the call can be retried once it is",
        meta={"sqlstate": state} if state else None,
    )


#: SQLSTATEs of a transaction the server rolled back to break a conflict: a
#: deadlock and a serialization failure. Running it again is the documented cure.
CONFLICT_STATES = frozenset({"40P01", "40001"})


def conflict(exc: BaseException) -> DriverError:
    """The ``X_DRIVER_CONFLICT`` error for a deadlock or a serialization failure.

    Like :func:`unavailable`, the message names the class and SQLSTATE only: the
    server's text names the relation and the tuple, and may quote a key's value."""
    state = getattr(exc, "sqlstate", None)
    return DriverError(
        ErrorCode.X_DRIVER_CONFLICT,
        f"PostgreSQL rolled the transaction back to break a conflict ({type(exc).__name__}, "
        f"SQLSTATE {state}); nothing of it was written — run it again",
        meta={"sqlstate": state},
    )


def translate(exc: psycopg.Error) -> BaseException:
    """The exception a psycopg error becomes at this boundary: a connection failure
    is :func:`unavailable`, a conflict is :func:`conflict`, anything else (an error
    in the statement itself) stays as psycopg raised it."""
    if is_connection_error(exc):
        return unavailable(exc)
    if getattr(exc, "sqlstate", None) in CONFLICT_STATES:
        return conflict(exc)
    return exc


def is_connection_error(exc: BaseException) -> bool:
    """A failure of the connection, as opposed to an error in a statement."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        state = getattr(exc, "sqlstate", None)
        # Statement-level operational errors (lock timeouts, cancels, serialisation)
        # leave the connection usable; class 08 and a missing SQLSTATE do not.
        return state is None or state.startswith("08") or state.startswith("57P")
    return False


# --------------------------------------------------------------------------- waiting


def _ready_now(fileno: int, wait: int) -> int:
    poller = select.poll()
    mask = (select.POLLIN if wait & _WAIT_R else 0) | (select.POLLOUT if wait & _WAIT_W else 0)
    poller.register(fileno, mask)
    ready = 0
    for _fd, ev in poller.poll(0):
        if ev & (select.POLLIN | select.POLLERR | select.POLLHUP):
            ready |= _READY_R
        if ev & select.POLLOUT:
            ready |= _READY_W
    return ready


async def _wait_fd(fileno: int, wait: int) -> int:
    """Block until ``fileno`` is ready for ``wait``; answer the psycopg ``Ready`` mask."""
    if wait == _WAIT_R:
        await trio.lowlevel.wait_readable(fileno)
        return int(_READY_R)
    if wait == _WAIT_W:
        await trio.lowlevel.wait_writable(fileno)
        return int(_READY_W)
    # Read-or-write: the socket is nearly always writable, so ask first.
    ready = _ready_now(fileno, wait)
    if ready:
        await trio.lowlevel.checkpoint()
        return ready
    got = 0
    async with trio.open_nursery() as nursery:

        async def side(waiter: Callable[[int], Any], flag: int) -> None:
            nonlocal got
            await waiter(fileno)
            got |= flag
            nursery.cancel_scope.cancel()

        nursery.start_soon(side, trio.lowlevel.wait_readable, int(_READY_R))
        nursery.start_soon(side, trio.lowlevel.wait_writable, int(_READY_W))
    return got


async def _drive(gen: PQGen[RV], fileno: int) -> RV:
    """Run a psycopg generator to completion on Trio."""
    try:
        wait = next(gen)
        while True:
            ready = await _wait_fd(fileno, wait)
            wait = gen.send(ready)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    except OSError as exc:
        raise psycopg.OperationalError("connection socket closed") from exc


async def _poll_until_ok(poll: Callable[[], int], socket: Callable[[], int], what: str) -> None:
    """Drive one of libpq's non-blocking handshakes (a connect, a cancel request)
    to its end: ``poll()`` answers a ``pq.PollingStatus``; READING and WRITING
    say which way to wait on ``socket()`` (read again each time: libpq may move
    to another socket, trying the next host)."""
    try:
        while True:
            status = poll()
            if status == _POLL_OK:
                return
            if status == _POLL_READING:
                await trio.lowlevel.wait_readable(socket())
            elif status == _POLL_WRITING:
                await trio.lowlevel.wait_writable(socket())
            elif status == _POLL_FAILED:
                raise psycopg.OperationalError(f"{what} failed")
            else:
                raise psycopg.InternalError(f"{what}: unexpected poll status {status}")
    except OSError as exc:
        raise psycopg.OperationalError(f"{what}: the socket closed") from exc


async def _connect_pgconn(conninfo: str) -> pq.abc.PGconn:
    """Open one libpq connection without blocking Trio: ``PGconn.connect_start``
    then ``connect_poll`` until it is up, then non-blocking mode (psycopg's
    query generators expect it). A failure finishes the connection; its message
    is not kept (libpq's may name the host, the user or a password fragment)."""
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        if pgconn.status == _CONN_BAD:
            raise psycopg.OperationalError("connection is bad")
        await _poll_until_ok(pgconn.connect_poll, lambda: pgconn.socket, "connection")
        pgconn.nonblocking = 1
    except BaseException:
        pgconn.finish()
        raise
    return pgconn


class TrioConnection(psycopg.AsyncConnection[Row]):
    """A psycopg ``AsyncConnection`` whose waits are Trio's.

    Only ever used by one Trio task at a time (the pool hands it out); its
    inherited asyncio lock is therefore never contended and never touches an
    event loop."""

    #: The statements :func:`_run_text` prepared on this session (their names).
    text_prepared: set[bytes]
    #: A poll object for the session's socket, readable: what
    #: :func:`_idle_usable` asks before an idle connection is reused.
    idle_poll: select.poll

    async def wait(
        self, gen: PQGen[RV], interval: float | None = None, timeout: float | None = None
    ) -> RV:
        """Run psycopg's generator ``gen`` on Trio (``interval`` is psycopg's
        polling period: unused, Trio wakes on readiness; past ``timeout``
        seconds, :class:`WaitTimeout`)."""
        fileno = self.pgconn.socket
        try:
            if timeout is None:
                return await _drive(gen, fileno)
            with trio.move_on_after(timeout):
                return await _drive(gen, fileno)
            raise WaitTimeout("wait timeout expired")
        except trio.Cancelled:
            await self._after_cancel(gen, fileno)
            raise

    async def _after_cancel(self, gen: PQGen[Any], fileno: int) -> None:
        """Cancel the running query on the server and drain it, or close."""
        if self.closed or self.pgconn.transaction_status != _ACTIVE:
            return
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + CANCEL_GRACE
            try:
                await cancel_query(self)
                await _drive(gen, fileno)
            except psycopg.errors.QueryCanceled:
                pass  # the answer a cancelled query gives
            except BaseException as exc:
                logger.warning("jobs.postgres.cancel_failed", extra={"error": type(exc).__name__})
                self.pgconn.finish()
                return
        if scope.cancelled_caught:
            logger.warning("jobs.postgres.cancel_timeout")
            self.pgconn.finish()


async def cancel_query(conn: TrioConnection) -> None:
    """Ask the server to cancel what ``conn`` is running (non-blocking cancel on
    libpq >= 17, a worker thread otherwise).

    The worker thread's ``PQcancel`` has no timeout of its own (a server that
    takes the request and never closes the socket holds it for ever): it is
    abandoned when the caller's scope is cancelled or runs out, so the caller's
    grace bounds it as it bounds the non-blocking cancel."""
    if psycopg.capabilities.has_cancel_safe():
        cancel_conn = conn.pgconn.cancel_conn()
        try:
            cancel_conn.start()
            await _poll_until_ok(cancel_conn.poll, lambda: cancel_conn.socket, "cancellation")
        finally:
            cancel_conn.finish()
    else:
        await trio.to_thread.run_sync(conn.cancel, abandon_on_cancel=True)


def _json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    import orjson

    return orjson.loads(bytes(data) if isinstance(data, memoryview) else data)


async def connect(conninfo: str, *, timeout: float = 10.0, prepare: bool = False) -> TrioConnection:
    """Open one autocommit :class:`TrioConnection`.

    Host names are resolved in a worker thread (libpq's resolution blocks);
    every other step runs on Trio. Without ``prepare`` the connection never
    prepares a statement on the server (psycopg would after a statement's fifth
    run): behind a transaction-mode pooler the next run may land on another
    server connection, where the prepared name does not exist
    (``InvalidSqlStatementName``) or names another statement
    (``DuplicatePreparedStatement``)."""
    params = conninfo_to_dict(conninfo)
    # One attempt per host (and address), as psycopg's own connect makes them.
    # The lookup blocks in its thread: the connect timeout bounds it too.
    try:
        with trio.fail_after(timeout):
            attempts = await trio.to_thread.run_sync(
                conninfo_attempts, params, abandon_on_cancel=True
            )
    except trio.TooSlowError as exc:
        raise unavailable(exc) from None
    last: BaseException | None = None
    for attempt in attempts:
        try:
            with trio.fail_after(timeout):
                pgconn = await _connect_pgconn(make_conninfo("", **attempt))
        except (psycopg.Error, trio.TooSlowError, OSError) as exc:
            last = exc
            continue
        conn = TrioConnection(pgconn)
        conn.text_prepared = set()
        conn.idle_poll = select.poll()
        conn.idle_poll.register(pgconn.socket, select.POLLIN)
        conn.prepare_threshold = PREPARE_THRESHOLD if prepare else None
        await conn.set_autocommit(True)
        set_json_loads(_json_loads, conn)
        return conn
    raise unavailable(last) from None


# --------------------------------------------------------------------------- pool


def _idle_usable(conn: TrioConnection) -> bool:
    """Whether an idle pooled connection can take a statement.

    An idle session is sent nothing unless the server is ending it: a restart,
    ``pg_terminate_backend`` or an idle timeout sends a FATAL message and closes
    the socket, which libpq notices only when the next statement fails. A
    readable idle socket is therefore discarded before use: otherwise every
    pooled connection fails one call with ``X_DRIVER_UNAVAILABLE`` after a
    server restart, long after the server is back (a step record, a settle or a
    heartbeat lost for nothing). One ``poll`` per acquire (the connection's own
    poll object, registered for its socket once); a false alarm (a rare notice)
    costs one reconnect."""
    pgconn = conn.pgconn
    if pgconn.status != _CONN_OK:  # closed (BAD) included
        return False
    return not conn.idle_poll.poll(0)


class Pool:
    """A Trio pool of autocommit :class:`TrioConnection` objects.

    Connections open on demand up to ``max_size``; a connection that comes back
    broken, or inside a transaction it cannot roll back, is closed instead of
    reused. ``on_connect`` runs once on each new connection (search_path...)."""

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        on_connect: Callable[[TrioConnection], Any] | None = None,
        prepare: bool = False,
    ) -> None:
        self.conninfo = conninfo
        self.prepare = prepare
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self._on_connect = on_connect
        self._idle: list[TrioConnection] = []
        self._slots = trio.Semaphore(max_size)
        self._all: set[TrioConnection] = set()
        self.closed = False

    @property
    def size(self) -> int:
        return len(self._all)

    def set_prepare(self, prepare: bool) -> None:
        """Whether connections prepare statements, the open ones included."""
        self.prepare = prepare
        for conn in self._all:
            conn.prepare_threshold = PREPARE_THRESHOLD if prepare else None

    async def _new(self) -> TrioConnection:
        conn = await connect(self.conninfo, timeout=self.connect_timeout, prepare=self.prepare)
        try:
            if self._on_connect is not None:
                await self._on_connect(conn)
        except BaseException:
            await conn.close()
            raise
        self._all.add(conn)
        return conn

    async def acquire(self) -> TrioConnection:
        if self.closed:
            raise unavailable(None, "PostgreSQL (the driver is closed)")
        # A free slot is taken without a schedule point (Semaphore.acquire always
        # yields to the scheduler: a whole pass of the run loop per statement);
        # the statement's own wait for its answer is the call's checkpoint, and a
        # cancelled scope still refuses here, before anything is sent.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if _idle_usable(conn):
                    return conn
                self._discard(conn)
            return await self._new()
        except BaseException:
            self._slots.release()
            raise

    async def release(self, conn: TrioConnection) -> None:
        try:
            pgconn = conn.pgconn
            if pgconn.status != _CONN_OK or self.closed:  # a closed one is BAD
                self._discard(conn)
                return
            if pgconn.transaction_status != _IDLE:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + CANCEL_GRACE
                    try:
                        await conn.execute("ROLLBACK")
                    except psycopg.Error:
                        pass
                if conn.closed or conn.pgconn.transaction_status != _IDLE:
                    self._discard(conn)
                    return
            self._idle.append(conn)
        finally:
            self._slots.release()

    def _discard(self, conn: TrioConnection) -> None:
        self._all.discard(conn)
        if not conn.closed:
            conn.pgconn.finish()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[TrioConnection]:
        conn = await self.acquire()
        try:
            yield conn
        finally:
            await self.release(conn)

    async def close(self) -> None:
        self.closed = True
        for conn in list(self._all):
            self._discard(conn)
        self._idle.clear()


# --------------------------------------------------------------------------- database


async def _run_params(conn: TrioConnection, sql: str, params: Params, _prepare: bool) -> list[Row]:
    """:func:`_run` as :meth:`Database._on_pool` calls it (psycopg's connection
    decides its own preparing)."""
    return await _run(conn, sql, params)


async def _run(conn: TrioConnection, sql: str, params: Params) -> list[Row]:
    cur = conn.cursor()
    await cur.execute(sql, params)
    if cur.pgresult is not None and cur.pgresult.status == pq.ExecStatus.TUPLES_OK:
        return await cur.fetchall()
    return []


#: Parameters of :func:`_run_text`: each one's text form (``None`` is NULL).
TextParams = Sequence[str | None]
#: A row as :func:`_run_text` answers it: each column's text form.
TextRow = tuple[bytes | None, ...]


def _results(pgconn: pq.abc.PGconn) -> PQGen[list[pq.abc.PGresult]]:
    """Flush what was sent, then read every result of it: the generator psycopg's
    own execute is, over the documented ``psycopg.pq`` calls only."""
    while pgconn.flush():
        ready = yield _WAIT_RW
        if ready & _READY_R:
            pgconn.consume_input()
    out: list[pq.abc.PGresult] = []
    while True:
        if pgconn.is_busy():
            yield _WAIT_R
            pgconn.consume_input()
            continue
        res = pgconn.get_result()
        if res is None:
            return out
        out.append(res)


async def _answer(conn: TrioConnection) -> list[pq.abc.PGresult]:
    """``await conn.wait(_results(conn.pgconn))`` for a statement just sent, in
    fewer Python layers (the text path's one wait per call): what was sent is
    nearly always flushed at once, then one ``wait_readable`` until the answer
    is in. A cancelled wait cancels the statement on the server and drains it
    (:meth:`TrioConnection._after_cancel`), as every other wait does."""
    pgconn = conn.pgconn
    if pgconn.flush():  # the socket took part of it: the general loop
        return await conn.wait(_results(pgconn))
    out: list[pq.abc.PGresult] = []
    while True:
        if pgconn.is_busy():
            fileno = pgconn.socket
            try:
                await trio.lowlevel.wait_readable(fileno)
            except trio.Cancelled:
                await conn._after_cancel(_results(pgconn), fileno)
                raise
            except OSError as exc:
                raise psycopg.OperationalError("connection socket closed") from exc
            pgconn.consume_input()
            continue
        res = pgconn.get_result()
        if res is None:
            return out
        out.append(res)


@functools.lru_cache(maxsize=256)
def statement_name(sql: str) -> bytes:
    """The name :func:`_run_text` prepares ``sql`` under: one per text, so two
    schemas' (or two versions') texts on one session never share a name, and
    none meets psycopg's own (``_pg3_N``)."""
    return b"trio_jobs_" + hashlib.blake2s(sql.encode(), digest_size=10).hexdigest().encode()


async def _run_text(
    conn: TrioConnection, sql: str, params: TextParams, prepare: bool
) -> list[TextRow]:
    """One statement of ``$n`` placeholders, straight through libpq: parameters
    and answer in their text forms, no cursor, no adaptation, no prepared-
    statement bookkeeping of psycopg's. For the hottest statements (an
    ``enqueue``): psycopg's cursor costs more client time per call than the
    statement's own parse and run on the server (benchmarks/README.md).

    With ``prepare`` (a direct connection, see :meth:`Database.is_direct`) the
    statement is prepared on the session once, by name, and then sent as a Bind
    alone; without it (a pooler may hand the next statement to another server
    connection) it is sent whole each time, as an unnamed statement. Either way
    one round trip, and waits go through :meth:`TrioConnection.wait`, so a
    cancelled call cancels the statement on the server as any other does."""
    pgconn = conn.pgconn
    # The session's client encoding, as psycopg itself encodes parameters (read
    # each call: a SET may change it); UTF8, nearly always, without a lookup.
    server_encoding = pgconn.parameter_status(b"client_encoding")
    encoding = "utf-8" if server_encoding == b"UTF8" else conn.info.encoding
    values = [None if v is None else v.encode(encoding) for v in params]
    # Inside a transaction block the statement is sent whole (unnamed): a
    # statement the session lost there would fail the caller's transaction.
    if prepare and pgconn.transaction_status == _IDLE:
        name = statement_name(sql)
        for again in (False, True):
            if name not in conn.text_prepared:
                pgconn.send_prepare(name, sql.encode(encoding))
                _raise_failed(await conn.wait(_results(pgconn)), conn)
                conn.text_prepared.add(name)
            pgconn.send_query_prepared(name, values)
            results = await _answer(conn)
            try:
                _raise_failed(results, conn)
            except psycopg.errors.InvalidSqlStatementName:
                # The session's prepared statements were dropped (psycopg sends
                # DEALLOCATE ALL when a schema change invalidates its own): the
                # Bind ran nothing, so prepare again and send it once more.
                conn.text_prepared.clear()
                if again:
                    raise
                continue
            break
    else:
        pgconn.send_query_params(sql.encode(encoding), values)
        results = await _answer(conn)
        _raise_failed(results, conn)
    out: list[TextRow] = []
    for res in results:
        if res.status == _TUPLES_OK:
            get = res.get_value
            columns = range(res.nfields)
            for row in range(res.ntuples):
                out.append(tuple([get(row, col) for col in columns]))
    return out


def _raise_failed(results: Sequence[pq.abc.PGresult], conn: TrioConnection) -> None:
    for res in results:
        if res.status == _FATAL_ERROR:
            raise psycopg.errors.error_from_result(res, encoding=conn.info.encoding)


class Transaction:
    """A Trio-side handle on one open transaction: each :meth:`execute` is one
    round trip on the transaction's connection."""

    def __init__(self, conn: TrioConnection, *, prepare: bool = False) -> None:
        self.conn = conn
        self.prepare = prepare
        self.after_commit: list[Callable[[], None]] = []

    async def execute(self, sql: str, params: Params = None) -> list[Row]:
        try:
            return await _run(self.conn, sql, params)
        except psycopg.Error as exc:
            found = translate(exc)
            if found is not exc:
                raise found from None
            raise

    async def fetch_text(self, sql: str, params: TextParams) -> list[TextRow]:
        """:meth:`Database.fetch_text` inside the transaction (``sql`` names its
        objects through the transaction's ``search_path``)."""
        try:
            return await _run_text(self.conn, sql, params, self.prepare)
        except psycopg.Error as exc:
            found = translate(exc)
            if found is not exc:
                raise found from None
            raise


class Database:
    """What the driver calls. Every call is either one statement on an autocommit
    connection (atomic by itself) or one whole transaction.

    Nothing a call does outlives it on the server connection, so every call is
    safe behind a transaction-mode pooler: with a ``schema``, a lone statement
    names its objects in it (:func:`~._sql.qualify`) and a transaction opens
    with ``SET LOCAL search_path`` (undone by its own end); no session ``SET``,
    no session advisory lock, and no prepared statement unless the pool's
    ``prepare`` says the pooler keeps them."""

    def __init__(self, pool: Pool, *, schema: str | None = None) -> None:
        self.pool = pool
        self.schema = schema
        self._begin = (
            "BEGIN" if schema is None else f"BEGIN; SET LOCAL search_path TO {quote_ident(schema)}"
        )
        #: When the current outage began (Trio time), None while calls succeed.
        self.down_since: float | None = None
        self._failed_calls = 0
        self._last_failure = 0.0

    def _outage(self, exc: BaseException) -> None:
        """A call failed for want of a connection: the first of an outage logs
        ``jobs.driver.unavailable`` (a warning), the rest only count. A pooler
        restart or a refused connect fails every statement in flight and every
        retry of each; one line says what happened, not one a statement."""
        if not (isinstance(exc, DriverError) and exc.code == ErrorCode.X_DRIVER_UNAVAILABLE):
            return
        self._failed_calls += 1
        self._last_failure = trio.current_time()
        if self.down_since is None:
            self.down_since = trio.current_time()
            emit(
                logger,
                logging.WARNING,
                "jobs.driver.unavailable",
                code=exc.code,
                sqlstate=(exc.meta or {}).get("sqlstate"),
                hint="statements fail until PostgreSQL (or the pooler in front of it) takes "
                "connections again; settles and step writes retry, the claim backs off",
            )

    def _recovered(self) -> None:
        """A call succeeded: the outage is over once none has failed for
        :data:`RECOVERED_AFTER` (a pooler at its ``max_client_conn`` refuses new
        connections while pooled ones still work: one outage, not a line a flap)."""
        if (
            self.down_since is not None
            and trio.current_time() - self._last_failure >= RECOVERED_AFTER
        ):
            emit(
                logger,
                logging.INFO,
                "jobs.driver.recovered",
                down_for=round(trio.current_time() - self.down_since, 3),
                failed_calls=self._failed_calls,
            )
            self.down_since = None
            self._failed_calls = 0

    async def is_direct(self) -> bool:
        """Whether the pool's connections reach the server itself: the address
        and port the client connected to are the ones the server's end of the
        connection has (TCP), or the client's socket is in one of the server's
        socket directories with its port (a Unix socket). A pooler (PgBouncer),
        a proxy or a port mapping in between answers no: something there may
        hand the next statement to another server connection, so nothing may be
        prepared on the server (a prepared name would be missing there, or name
        another client's statement)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT host(inet_server_addr()), inet_server_port(), current_setting('port'), "
                "current_setting('unix_socket_directories')"
            )
            addr, port, setting_port, socket_dirs = (await cur.fetchall())[0]
            info = conn.info
            host, hostaddr, client_port = info.host, info.hostaddr, str(info.port)
        if addr is None:  # the server's end is a Unix socket
            dirs = [d.strip() for d in str(socket_dirs or "").split(",")]
            return host.startswith("/") and client_port == str(setting_port) and host in dirs
        return client_port == str(port) and bool(hostaddr) and hostaddr == addr

    def prepare_from_now(self, prepare: bool) -> None:
        """Prepare statements on the server (after psycopg's fifth run) or not, on
        every connection of the pool from now on."""
        self.pool.set_prepare(prepare)

    async def fetch(self, sql: str, params: Params = None) -> list[Row]:
        """Run one statement; its rows (none for a statement that returns none)."""
        if self.schema is not None:
            sql = qualify(sql, self.schema)
        return await self._on_pool(_run_params, sql, params, False)

    async def fetch_text(self, sql: str, params: TextParams) -> list[TextRow]:
        """Run one statement of ``$1``-style placeholders through libpq directly
        (:func:`_run_text`): parameters in their text forms (``None`` is NULL),
        each row's columns as text bytes. One round trip, like :meth:`fetch`."""
        if self.schema is not None:
            sql = qualify(sql, self.schema)
        return await self._on_pool(_run_text, sql, params, self.pool.prepare)

    async def _on_pool(
        self,
        run: Callable[[TrioConnection, str, _P, bool], Awaitable[_R]],
        sql: str,
        params: _P,
        prepare: bool,
    ) -> _R:
        """``run(conn, sql, params, prepare)`` on a pooled connection, its errors
        translated and an outage noted once (what :meth:`fetch` and
        :meth:`fetch_text` share)."""
        pool = self.pool
        try:
            conn = await pool.acquire()
            try:
                rows = await run(conn, sql, params, prepare)
            finally:
                await pool.release(conn)
        except psycopg.Error as exc:
            found = translate(exc)
            if found is not exc:
                self._outage(found)
                raise found from None
            raise
        except DriverError as exc:
            self._outage(exc)
            raise
        if self.down_since is not None:
            self._recovered()
        return rows

    async def script(self, sql: str) -> None:
        """Run a parameterless multi-statement script (simple query protocol)."""
        await self.fetch(sql)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """``BEGIN`` ... ``COMMIT`` on one connection; an exception (or a
        cancellation) rolls back, shielded and bounded."""
        try:
            conn = await self.pool.acquire()
        except psycopg.Error as exc:
            found = unavailable(exc)
            self._outage(found)
            raise found from None
        except DriverError as exc:
            self._outage(exc)
            raise
        try:
            try:
                await conn.execute(self._begin)
            except psycopg.Error as exc:
                found = unavailable(exc)
                self._outage(found)
                raise found from None
            tx = Transaction(conn, prepare=self.pool.prepare)
            try:
                yield tx
            except BaseException:
                await _rollback(conn)
                raise
            try:
                await conn.execute("COMMIT")
            except psycopg.Error as exc:
                # A connection lost here leaves the outcome unknown (the commit may
                # have landed); a conflict (a serializable commit) rolled back.
                translated = translate(exc)
                if translated is not exc:
                    self._outage(translated)
                    raise translated from None
                raise
            if self.down_since is not None:
                self._recovered()
            for hook in tx.after_commit:
                hook()
        finally:
            await self.pool.release(conn)


async def _rollback(conn: TrioConnection) -> None:
    if conn.closed:
        return
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + CANCEL_GRACE
        try:
            await conn.execute("ROLLBACK")
        except psycopg.Error:
            conn.pgconn.finish()
    if scope.cancelled_caught and not conn.closed:
        conn.pgconn.finish()
