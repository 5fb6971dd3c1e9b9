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
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ...logging import emit
from .._push_wake import PushWake

__all__ = ["RedisWake"]

logger = logging.getLogger("trio_jobs.redis")


class RedisWake(PushWake):
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
        super().__init__(
            send_probe,
            start,
            logger=logger,
            log_fields={},
            unverified_hint="a probe published through the pool never came back on the "
            "subscription; the worker keeps its 2 s poll ceiling",
        )

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
                emit(
                    logger,
                    logging.WARNING,
                    "jobs.wake.lost",
                    kind=type(exc).__name__,
                    retry_in=backoff,
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
