"""The PostgreSQL driver's task store (``sql/tasks.sql``, migration 0006).

Leases and due decisions use the database's clock; every call is one
statement: the leases of all a scheduler's tasks in one upsert, and every fire
of one instant (the occurrences' rows, the watermarks) in one statement."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._serialization import dumps
from .._tasks import TaskFire, TaskLead, TaskRow, TaskSpec

if TYPE_CHECKING:
    from ._driver import PostgresDriver

__all__ = ["PgTasks"]


def _json(value: Any) -> str:
    return dumps(value).decode()


def _f(value: Any) -> float | None:
    return None if value is None else float(value)


class PgTasks:
    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver

    async def lead(self, leader: str, tasks: Sequence[TaskSpec], ttl: float) -> list[TaskLead]:
        if not tasks:
            self._d.db  # noqa: B018 — a closed driver refuses even an empty call
            return []
        rows = await self._d._fetch(
            "task_lead",
            {
                "names": [t.name for t in tasks],
                "schedules": [t.schedule for t in tasks],
                "tzs": [t.tz for t in tasks],
                "catch_ups": [t.catch_up for t in tasks],
                "queues": [t.queue for t in tasks],
                "leader": leader,
                "ttl": float(ttl),
            },
        )
        by_name = {
            str(r[0]): TaskLead(
                name=str(r[0]),
                leader=r[1],
                lease_expires_at=_f(r[2]),
                watermark=float(r[3]),
                last_fire=_f(r[4]),
                paused=bool(r[5]),
            )
            for r in rows
        }
        return [by_name[t.name] for t in tasks]

    async def fire(self, leader: str, fires: Sequence[TaskFire]) -> builtins.list[str]:
        if not fires:
            self._d.db  # noqa: B018
            return []
        rows: list[dict[str, Any]] = []
        for f in fires:
            for r in f.requests:
                rows.append(
                    {
                        "ord": len(rows) + 1,
                        "task": f.name,
                        "id": r.id,
                        "run_id": r.run_id,
                        "name": r.name,
                        "queue": r.queue,
                        "payload": r.payload,
                        "idempotency_key": r.idempotency_key,
                        "concurrency_key": r.concurrency_key,
                        "max_attempts": r.max_attempts,
                    }
                )
        answer = await self._d._fetch(
            "task_fire",
            {
                "leader": leader,
                "fires": _json(
                    [
                        {
                            "name": f.name,
                            "watermark": f.watermark,
                            "through": f.through,
                            "last_fire": f.last_fire,
                        }
                        for f in fires
                    ]
                ),
                "rows": _json(rows),
                "channel": self._d.channel,
            },
        )
        moved = [str(name) for kind, name in answer if kind == "task"]
        woke = [str(q) for kind, q in answer if kind == "queue"]
        self._d._fire(woke)  # this process's idle workers need no round trip
        return moved

    async def release(self, leader: str, names: Sequence[str]) -> None:
        await self._d._fetch("task_release", {"leader": leader, "names": list(names)})

    async def pause(self, name: str) -> None:
        await self._d._fetch("task_pause", {"name": name})

    async def resume(self, name: str) -> None:
        await self._d._fetch("task_resume", {"name": name})

    async def rows(self) -> builtins.list[TaskRow]:
        rows = await self._d._fetch("task_rows", {})
        return [
            TaskRow(
                name=str(r[0]),
                schedule=str(r[1]),
                tz=str(r[2]),
                catch_up=str(r[3]),
                queue=str(r[4]),
                paused=bool(r[5]),
                watermark=float(r[6]),
                armed_at=float(r[7]),
                last_fire=_f(r[8]),
                fired_at=_f(r[9]),
                leader=r[10],
                lease_expires_at=_f(r[11]),
            )
            for r in rows
        ]

    async def paused(self) -> builtins.list[str]:
        rows = await self._d._fetch("task_paused", {})
        return [str(r[0]) for r in rows]
