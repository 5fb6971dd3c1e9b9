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
from collections.abc import Awaitable, Callable

import psycopg
import trio

from ...logging import emit
from .._push_wake import PushWake
from ._bridge import TrioConnection, connect

__all__ = ["PgWake"]

logger = logging.getLogger("trio_jobs.postgres")


class PgWake(PushWake):
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
        super().__init__(
            send_probe,
            start,
            logger=logger,
            log_fields={"channel": channel},
            unverified_hint="a probe sent through the pool never came back on the LISTEN "
            "session (PgBouncer in transaction mode?); the worker keeps its 2 s poll "
            "ceiling. Pass listen_dsn= (trio-jobs worker --listen-database-url) a direct or "
            "session-pooled address for the LISTEN session.",
        )

    # ------------------------------------------------------------------ the session

    async def run(self) -> None:
        """Hold the LISTEN session; re-dial with backoff while the driver is open."""
        backoff = 0.25
        while True:
            try:
                conn = await connect(self._conninfo())
            except Exception:
                emit(logger, logging.WARNING, "jobs.wake.reconnect", retry_in=backoff)
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
                emit(logger, logging.WARNING, "jobs.wake.lost")
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
