"""The memory driver's task store: the reference semantics of
:class:`~trio_jobs.drivers.TaskStore`. The process is its fleet: every worker
over one memory driver competes for the same leases. Each call completes
without yielding, so a fire's rows and its watermark move in one step."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from .._tasks import TaskFire, TaskLead, TaskRow, TaskSpec

if TYPE_CHECKING:
    from ._driver import MemoryDriver

__all__ = ["MemoryTasks"]


@attrs.define
class _Task:
    spec: TaskSpec
    watermark: float
    armed_at: float
    last_fire: float | None = None
    fired_at: float | None = None
    leader: str | None = None
    lease_expires_at: float | None = None


class MemoryTasks:
    def __init__(self, driver: MemoryDriver) -> None:
        self._d = driver
        self._tasks: dict[str, _Task] = {}
        self._paused: dict[str, float] = {}

    async def lead(self, leader: str, tasks: Sequence[TaskSpec], ttl: float) -> list[TaskLead]:
        d = self._d
        d._check_open()
        now = d.now()
        out = []
        for spec in tasks:
            row = self._tasks.get(spec.name)
            if row is None:
                row = self._tasks[spec.name] = _Task(spec, watermark=now, armed_at=now)
            expires = row.lease_expires_at
            if row.leader is None or row.leader == leader or expires is None or expires <= now:
                row.spec = spec
                row.leader = leader
                row.lease_expires_at = now + ttl
            out.append(
                TaskLead(
                    name=spec.name,
                    leader=row.leader,
                    lease_expires_at=row.lease_expires_at,
                    watermark=row.watermark,
                    last_fire=row.last_fire,
                    paused=spec.name in self._paused,
                )
            )
        return out

    def _fires(self, leader: str, fire: TaskFire, now: float) -> bool:
        """Whether ``fire`` lands now: its task led by ``leader`` (lease live), at
        the watermark the leader holds, and not paused."""
        row = self._tasks.get(fire.name)
        return (
            row is not None
            and row.leader == leader
            and row.lease_expires_at is not None
            and row.lease_expires_at > now
            and row.watermark == fire.watermark
            and fire.name not in self._paused
        )

    async def fire(self, leader: str, fires: Sequence[TaskFire]) -> builtins.list[str]:
        d = self._d
        d._check_open()
        now = d.now()
        landed = []
        for fire in fires:
            if not self._fires(leader, fire, now):
                continue
            if fire.requests:
                d._enqueue(fire.requests, tx=None)
            row = self._tasks[fire.name]
            row.watermark = fire.through
            if fire.last_fire is not None:
                row.last_fire = fire.last_fire
                row.fired_at = now
            landed.append(fire.name)
        return landed

    async def release(self, leader: str, names: Sequence[str]) -> None:
        for name in names:
            row = self._tasks.get(name)
            if row is not None and row.leader == leader:
                row.leader = None
                row.lease_expires_at = None

    async def pause(self, name: str) -> None:
        self._d._check_open()
        self._paused.setdefault(name, self._d.now())

    async def resume(self, name: str) -> None:
        self._d._check_open()
        self._paused.pop(name, None)

    async def rows(self) -> builtins.list[TaskRow]:
        self._d._check_open()
        return [
            TaskRow(
                name=name,
                schedule=row.spec.schedule,
                tz=row.spec.tz,
                catch_up=row.spec.catch_up,
                queue=row.spec.queue,
                paused=name in self._paused,
                watermark=row.watermark,
                armed_at=row.armed_at,
                last_fire=row.last_fire,
                fired_at=row.fired_at,
                leader=row.leader,
                lease_expires_at=row.lease_expires_at,
            )
            for name, row in sorted(self._tasks.items())
        ]

    async def paused(self) -> builtins.list[str]:
        self._d._check_open()
        return sorted(self._paused)
