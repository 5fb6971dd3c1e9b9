"""The wake: one pub/sub subscription per process, proven by a probe.

The enqueue, hand-back and publish scripts ``PUBLISH`` the queue name of every
row they make due on the driver's channel (inside the script, so a message goes
out only for a write that happened). This subscription wakes the workers
waiting on that queue. The poll is the guarantee: a message published while the
subscription is down is lost, so the session re-dials with backoff, lets every
waiter run one pass when it is back, and the worker's poll ceiling covers the
gap.

The wake has to be proven: once subscribed, a probe is published through the
command pool; when it comes back on the subscription the wake is live
(``jobs.wake.live``), and the worker may idle up to 5 s between polls.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

__all__ = ["RedisWake"]

logger = logging.getLogger("trio_jobs.redis")

#: A message no queue can be named: the probe's prefix.
PROBE_PREFIX = "\x1fprobe:"
#: How long the probe may take to come back before the wake is called unverified.
PROBE_TIMEOUT = 5.0


class _Waiter:
    __slots__ = ("event", "queues")

    def __init__(self, queues: frozenset[str]) -> None:
        self.queues = queues
        self.event = trio.Event()


class RedisWake:
    """A :class:`~trio_jobs.drivers.WakeSource` over Redis pub/sub.

    ``subscribe`` is an async context manager factory yielding an async iterator
    of messages on the channel (the driver's); ``send_probe`` publishes a
    message through the command pool; ``start`` runs the session in the
    driver's service nursery, lazily on the first :meth:`wait` (a process that
    only enqueues holds no subscription). :meth:`fire` wakes local waiters at
    once (this process's own enqueues do not wait for the round trip)."""

    def __init__(
        self,
        subscribe: Callable[[], Any],
        send_probe: Callable[[str], Awaitable[None]],
        start: Callable[[Callable[[], Awaitable[None]]], None],
    ) -> None:
        self._subscribe = subscribe
        self._send_probe = send_probe
        self._start = start
        self._waiters: set[_Waiter] = set()
        self._pending: set[str] = set()
        self._started = False
        self._probe_token: str | None = None
        self._probe_back = trio.Event()
        self._reported_unverified = False
        #: True once a probe published through the pool came back on the subscription.
        self.live = False
        #: How many messages the subscription has delivered (tests, metrics).
        self.received = 0
        #: How many times the subscription (re)connected.
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
            # Nobody waits on it yet (a worker between its claim and its wait):
            # the next wait on that queue returns at once.
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
        """Hold the subscription; re-dial with backoff while the driver is open."""
        backoff = 0.25
        while True:
            self.live = False
            try:
                async with self._subscribe() as messages:
                    backoff = 0.25
                    self.sessions += 1
                    # Anything published while the session was down is lost: let
                    # every waiter run one pass now.
                    self.fire(None)
                    await self._listen(messages)
            except Exception as exc:
                logger.warning(
                    "jobs.wake.lost",
                    extra={
                        "event": "jobs.wake.lost",
                        "kind": type(exc).__name__,
                        "retry_in": backoff,
                    },
                )
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _listen(self, messages: Any) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._probe, self.sessions)
            async for message in messages:
                if message.get("type") != "message":
                    continue
                data = message.get("data")
                if isinstance(data, bytes):
                    data = data.decode("utf-8", "replace")
                self._deliver(str(data))
            nursery.cancel_scope.cancel()
        raise ConnectionError("the subscription ended")

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
                logger.info("jobs.wake.live", extra={"event": "jobs.wake.live"})
            self.live = True
            return
        self.live = False
        if not self._reported_unverified:
            self._reported_unverified = True
            logger.warning(
                "jobs.wake.unverified",
                extra={
                    "event": "jobs.wake.unverified",
                    "hint": "a probe published through the pool never came back on the "
                    "subscription; the worker keeps its 2 s poll ceiling",
                },
            )
