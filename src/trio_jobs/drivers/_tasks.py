"""The scheduler's store: a driver capability (``JobDriver.tasks``).

Each task has one row in the driver's store: its schedule as declared (so an
operator reads it without the declaration), its **watermark** (every occurrence
at or before it is decided: fired or skipped), the last occurrence that fired,
and the lease of the process that leads it. A scheduler takes or renews the
leases of every task it serves in one round trip (:meth:`TaskStore.lead`), and
fires occurrences with :meth:`TaskStore.fire`: the occurrences' rows and the
watermark move together, fenced on the lease and on the watermark the leader
read, so a crash between them cannot fire an occurrence twice or skip one.
Times are float epoch seconds on the store's clock (the database's on
PostgreSQL, the server's on Redis).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Protocol

import attrs

from ._protocol import EnqueueRequest

__all__ = ["TaskFire", "TaskLead", "TaskRow", "TaskSpec", "TaskStore"]


@attrs.frozen
class TaskSpec:
    """A task as its scheduler registers it: what an operator reads back."""

    name: str
    #: The cron text, or ``every:<whole seconds>``.
    schedule: str
    tz: str
    catch_up: str
    queue: str


@attrs.frozen
class TaskLead:
    """A task's state after :meth:`TaskStore.lead`: who leads it now and until
    when (store clock), its watermark, its last fire, and whether it is paused."""

    name: str
    leader: str | None
    lease_expires_at: float | None
    watermark: float
    last_fire: float | None
    paused: bool


@attrs.frozen
class TaskFire:
    """One task's move: the occurrences' rows (oldest first; none for a skip)
    and the watermark from ``watermark`` (what the leader holds) to ``through``.
    ``last_fire`` is the newest occurrence fired (``None``: nothing fired)."""

    name: str
    watermark: float
    through: float
    requests: Sequence[EnqueueRequest] = ()
    last_fire: float | None = None


@attrs.frozen
class TaskRow:
    """A task as the store keeps it (the operator surface reads these)."""

    name: str
    schedule: str
    tz: str
    catch_up: str
    queue: str
    paused: bool
    watermark: float
    armed_at: float
    last_fire: float | None = None
    fired_at: float | None = None
    leader: str | None = None
    lease_expires_at: float | None = None


class TaskStore(Protocol):
    """Where scheduled tasks keep their watermarks, leases and pauses."""

    async def lead(self, leader: str, tasks: Sequence[TaskSpec], ttl: float) -> list[TaskLead]:
        """Register each task and take its lease for ``leader`` when nobody holds
        it, its holder's lease lapsed, or ``leader`` holds it already (a renewal:
        its expiry moves to now + ``ttl``); a task seen for the first time is
        armed at the store's now (its watermark: an occurrence at that very
        instant is not fired). The leader's declaration (schedule, zone,
        catch-up, queue) replaces the stored one. One round trip. Answers each
        task's state after the call, in the order given."""
        ...

    async def fire(self, leader: str, fires: Sequence[TaskFire]) -> builtins.list[str]:
        """Apply each fire whose task ``leader`` leads (its lease live), whose
        stored watermark is ``fire.watermark`` and which is not paused: enqueue
        its rows (deduped on their live key, as ``enqueue_many``) and move the
        watermark to ``fire.through`` (and the last fire), together or not at
        all. One round trip. Answers the names of the fires that landed."""
        ...

    async def release(self, leader: str, names: Sequence[str]) -> None:
        """Give up ``leader``'s leases of ``names`` (a clean stop: another
        process takes over at its next renewal instead of after the ttl)."""
        ...

    async def pause(self, name: str) -> None:
        """Pause the task fleet-wide: no fire lands until it is resumed."""
        ...

    async def resume(self, name: str) -> None:
        """Resume a paused task; its ``catch_up`` decides what it missed."""
        ...

    async def rows(self) -> builtins.list[TaskRow]:
        """Every task a scheduler registered, by name."""
        ...

    async def paused(self) -> builtins.list[str]:
        """The paused task names, sorted (registered or not)."""
        ...
