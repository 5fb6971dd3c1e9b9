"""The memory driver's rate-limit store: one sliding log per ``(name, key)`` in
this process, on the driver's clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._protocol import RateGrant
from .._window import SlidingLog

if TYPE_CHECKING:
    from ._driver import MemoryDriver

__all__ = ["MemoryRateLimits"]


class MemoryRateLimits:
    """Rate limits in this process's memory: atomic (no await inside a take),
    but not shared: another process keeps a budget of its own."""

    #: The store is this process: a ``scope="shared"`` limiter over it needs the
    #: worker to be the whole fleet (``Worker(fleet="single")``).
    shared = False

    def __init__(self, driver: MemoryDriver) -> None:
        self._d = driver
        self._log = SlidingLog()

    async def acquire(self, name: str, key: str, limit: int, per: float) -> RateGrant:
        self._d._check_open()
        wait = self._log.take((name, key), limit, per, self._d.now())
        return RateGrant(True) if wait is None else RateGrant(False, wait)
