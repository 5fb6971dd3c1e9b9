"""The outbox seam: what a relay reads, and what an app's transaction stages into.

An :class:`OutboxStore` lives in the app's own database. Inside
``jobs.transaction()`` an enqueue (or ``publish_event``) is *staged* as a row of
the store, in the app's transaction: it commits or vanishes with the app's
writes. A :class:`~trio_jobs.outbox.Relay` then moves committed rows onto the
queue driver. Every row keeps the id it was staged with, so a batch published
again after a crash (before its mark landed) adds no job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs

from ..drivers._protocol import DriverTransaction, WakeSource

__all__ = ["OutboxBatch", "OutboxRow", "OutboxStore"]


@attrs.frozen
class OutboxRow:
    """One staged row, as a relay claimed it.

    ``data`` is the row's stored JSON form (a job's enqueue request, under the
    id it was staged with, or an event); the relay decodes it, so a row this
    version cannot read is one poison row, not a failed claim. ``staged_at`` is
    on the store's clock; ``attempts`` counts the claims that tried to publish
    it. ``lease_until`` fences a release: a row another relay claimed since is
    left alone."""

    seq: int
    id: str
    data: Any
    staged_at: float
    attempts: int
    lease_until: float


@attrs.frozen
class OutboxBatch:
    """What a claim answers: the rows, in staging order, and the store's now
    (``0.0`` when no row was claimed)."""

    rows: Sequence[OutboxRow]
    now: float = 0.0


class OutboxStore(Protocol):
    """The transactional record of enqueues for a queue outside the app's database.

    ``mark_published_many`` is optional (``None``): a store without it is
    relayed row by row, two statements a row."""

    @property
    def name(self) -> str: ...

    @property
    def wake(self) -> WakeSource | None:
        """Wakes an idle relay when a staging transaction commits (``None``: poll only)."""
        ...

    async def open(self) -> None:
        """Connect and prepare (migrations). Constructing does no I/O."""
        ...

    async def close(self) -> None: ...

    def transaction(self) -> AbstractAsyncContextManager[DriverTransaction]:
        """The app's transaction: ``execute`` runs app SQL, enqueues and events stage rows."""
        ...

    async def claim(self, limit: int, lease: float) -> OutboxBatch:
        """Lease up to ``limit`` unpublished rows nobody holds, oldest first, in one
        round trip."""
        ...

    async def mark_published(self, row_id: str) -> None: ...

    @property
    def mark_published_many(self) -> Callable[[Sequence[str]], Awaitable[None]] | None:
        """Mark many rows published in one round trip, or ``None`` when unsupported."""
        ...

    async def release(
        self,
        rows: Sequence[OutboxRow],
        *,
        poison: str | None = None,
        error: str | None = None,
        hold: float | None = None,
    ) -> None:
        """Hand ``rows`` back unpublished. ``poison`` names the row that failed
        (its ``error`` is recorded; ``hold`` seconds keep it out of the next
        claims); the others are free at once and their claim is not counted."""
        ...

    async def purge(self, older_than: float, limit: int) -> int:
        """Delete up to ``limit`` rows published more than ``older_than`` seconds
        ago (on the store's clock); answers how many went. An unpublished row is
        never deleted."""
        ...
