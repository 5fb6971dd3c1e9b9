"""The part of a pushing wake that every driver shares: local waiters per queue,
and the probe that proves the push channel delivers.

A driver subclasses :class:`PushWake` and implements ``run`` (hold its session:
LISTEN on PostgreSQL, a pub/sub subscription on Redis), calling :meth:`_deliver`
for each message and :meth:`_probe` once per session.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

from ..logging import emit

__all__ = ["PROBE_PREFIX", "PROBE_TIMEOUT", "PushWake"]

#: Payloads starting with this are probes, never queue names.
PROBE_PREFIX = "\x1fprobe:"
#: How long a probe may take to come back before the wake is called unverified.
PROBE_TIMEOUT = 5.0


class _Waiter:
    __slots__ = ("event", "queues")

    def __init__(self, queues: frozenset[str]) -> None:
        self.queues = queues
        self.event = trio.Event()


class PushWake:
    """Waiters per queue, woken by :meth:`fire` (locally, at once) or by a
    delivered message; ``live`` once a probe sent through the driver's pool came
    back on the push session."""

    def __init__(
        self,
        send_probe: Callable[[str], Awaitable[None]],
        start: Callable[[Callable[[], Awaitable[None]]], None],
        *,
        logger: logging.Logger,
        log_fields: Mapping[str, Any],
        unverified_hint: str,
    ) -> None:
        self._send_probe = send_probe
        self._start = start
        self._logger = logger
        self._log_fields = dict(log_fields)
        self._unverified_hint = unverified_hint
        self._waiters: set[_Waiter] = set()
        self._pending: set[str] = set()
        self._started = False
        self._probe_token: str | None = None
        self._probe_back = trio.Event()
        self._reported_unverified = False
        #: True once a probe sent through the pool came back on the session.
        self.live = False
        #: How many messages the session has delivered (tests, metrics).
        self.received = 0
        #: How many times the session (re)connected.
        self.sessions = 0

    async def run(self) -> None:  # pragma: no cover - every driver overrides it
        raise NotImplementedError

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
            if timeout == math.inf:
                await waiter.event.wait()  # the caller's scope bounds it
                return True
            with trio.move_on_after(timeout):
                await waiter.event.wait()
                return True
            return False
        finally:
            self._waiters.discard(waiter)

    # ------------------------------------------------------------------ the session

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
                emit(self._logger, logging.INFO, "jobs.wake.live", **self._log_fields)
            self.live = True
            return
        self.live = False
        if not self._reported_unverified:
            self._reported_unverified = True
            emit(
                self._logger,
                logging.WARNING,
                "jobs.wake.unverified",
                **self._log_fields,
                hint=self._unverified_hint,
            )
