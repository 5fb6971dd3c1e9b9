"""The wake: one ``LISTEN`` session per process, proven by a probe.

Enqueue, nack-to-now, publish and resume statements carry a transactional
``pg_notify(channel, queue)``: delivered when the row commits, never when it
rolls back. This session listens on the channel and wakes the workers waiting on
that queue. The poll is the guarantee: a notification is lost with the session
that would have carried it, so the session re-dials with backoff and the
worker's poll ceiling covers the gap.

The wake has to be proven: once the session listens, a probe notification is
sent through the pool; when it comes back on the session the wake is live
(``jobs.wake.live``). If it never does (PgBouncer in transaction mode delivers
no notification), ``jobs.wake.unverified`` is logged once and ``live`` stays
false, so the worker keeps its short poll ceiling.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import psycopg
import trio

from ._bridge import TrioConnection, connect

__all__ = ["PgWake"]

logger = logging.getLogger("trio_jobs.postgres")

#: A payload no queue can have: the probe's, then a per-session token.
PROBE_PREFIX = "\x1fprobe:"
#: How long the probe may take to come back before the wake is called unverified.
PROBE_TIMEOUT = 5.0


class _Waiter:
    __slots__ = ("event", "queues")

    def __init__(self, queues: frozenset[str]) -> None:
        self.queues = queues
        self.event = trio.Event()


class PgWake:
    """A :class:`~trio_jobs.drivers.WakeSource` over ``LISTEN``/``NOTIFY``.

    ``start`` is called by the driver to run the session in its service nursery,
    lazily on the first :meth:`wait` (a process that only enqueues holds no
    session). :meth:`fire` wakes local waiters at once (this process's own
    commits do not wait for the round trip)."""

    def __init__(
        self,
        channel: str,
        conninfo: Callable[[], str],
        send_probe: Callable[[str], Awaitable[None]],
        start: Callable[[Callable[[], Awaitable[None]]], None],
    ) -> None:
        self.channel = channel
        self._conninfo = conninfo
        self._send_probe = send_probe
        self._start = start
        self._waiters: set[_Waiter] = set()
        self._pending: set[str] = set()
        self._started = False
        self._probe_token: str | None = None
        self._probe_back = trio.Event()
        self._reported_unverified = False
        #: True once a probe sent through the pool came back on the session.
        self.live = False
        #: How many notifications the session has delivered (tests, metrics).
        self.received = 0
        #: How many times the session (re)connected.
        self.sessions = 0

    def reset(self) -> None:
        """Forget the session (the driver reopened: the next wait starts a new one)."""
        self._started = False
        self.live = False

    # ------------------------------------------------------------------ waiting

    def fire(self, queues: Sequence[str] | None = None) -> None:
        """Wake every waiter on any of ``queues`` (``None``: everyone)."""
        woke = False
        for waiter in list(self._waiters):
            if queues is None or not waiter.queues.isdisjoint(queues):
                waiter.event.set()
                self._waiters.discard(waiter)
                woke = True
        if not woke and queues is not None:
            # Nobody is waiting on it yet (a worker between its claim and its
            # wait): the next wait on that queue returns at once.
            self._pending.update(queues)

    async def wait(self, queues: Sequence[str], timeout: float) -> bool:
        if not self._started:
            self._started = True
            self._start(self.run)
        wanted = frozenset(queues)
        hit = self._pending & wanted
        if hit:
            self._pending -= hit
            await trio.lowlevel.checkpoint()
            return True
        waiter = _Waiter(wanted)
        self._waiters.add(waiter)
        try:
            with trio.move_on_after(timeout):
                await waiter.event.wait()
                return True
            return False
        finally:
            self._waiters.discard(waiter)

    # ------------------------------------------------------------------ the session

    async def run(self) -> None:
        """Hold the LISTEN session; re-dial with backoff while the driver is open."""
        backoff = 0.25
        while True:
            try:
                conn = await connect(self._conninfo())
            except Exception:
                logger.warning(
                    "jobs.wake.reconnect",
                    extra={"event": "jobs.wake.reconnect", "retry_in": backoff},
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.25
            self.sessions += 1
            try:
                await self._listen(conn)
            # except*: _listen reads inside a nursery, which wraps the session's
            # failure (a server restart, a terminated backend) in an ExceptionGroup;
            # a bare except missed it and the wake died with its first session.
            except* (psycopg.Error, OSError):
                logger.warning("jobs.wake.lost", extra={"event": "jobs.wake.lost"})
            finally:
                with trio.CancelScope(shield=True):
                    await conn.close()
            # Unproven until the next session's probe comes back: the worker keeps
            # its short poll ceiling meanwhile.
            self.live = False
            # Anything sent while the session was down is lost: let every
            # waiter run one pass now.
            self.fire(None)

    async def _listen(self, conn: TrioConnection) -> None:
        await conn.execute(f'LISTEN "{self.channel}"')
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._probe, self.sessions)
            pgconn = conn.pgconn
            while True:
                await trio.lowlevel.wait_readable(pgconn.socket)
                pgconn.consume_input()
                while (note := pgconn.notifies()) is not None:
                    self._deliver(note.extra.decode("utf-8", "replace"))
                if pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the LISTEN session closed")

    def _deliver(self, payload: str) -> None:
        self.received += 1
        if payload.startswith(PROBE_PREFIX):
            if payload == self._probe_token:
                self._probe_back.set()
            return
        self.fire([payload])

    async def _probe(self, session: int) -> None:
        self._probe_token = f"{PROBE_PREFIX}{id(self)}:{session}"
        self._probe_back = trio.Event()
        try:
            await self._send_probe(self._probe_token)
        except Exception:
            pass
        with trio.move_on_after(PROBE_TIMEOUT):
            await self._probe_back.wait()
            if not self.live:
                logger.info(
                    "jobs.wake.live", extra={"event": "jobs.wake.live", "channel": self.channel}
                )
            self.live = True
            return
        self.live = False
        if not self._reported_unverified:
            self._reported_unverified = True
            logger.warning(
                "jobs.wake.unverified",
                extra={
                    "event": "jobs.wake.unverified",
                    "channel": self.channel,
                    "hint": "a probe sent through the pool never came back on the LISTEN "
                    "session (PgBouncer in transaction mode?); the worker keeps its 2 s "
                    "poll ceiling. Give workers a direct or session-pooled DATABASE_URL.",
                },
            )
