"""The Redis driver's task store (``lua/tasks.lua``): every call one script, the
lease decided with the server's clock (``TIME``, or a test clock), and a fire's
rows and watermark written by the same script."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._tasks import TaskFire, TaskLead, TaskRow, TaskSpec

if TYPE_CHECKING:
    from ._driver import RedisDriver

__all__ = ["RedisTasks"]


def _s(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _f(value: Any) -> float | None:
    text = _s(value) if value is not None else ""
    return float(text) if text else None


class RedisTasks:
    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def lead(self, leader: str, tasks: Sequence[TaskSpec], ttl: float) -> list[TaskLead]:
        args = [leader, repr(float(ttl)), str(len(tasks))]
        for t in tasks:
            args.extend([t.name, t.schedule, t.tz, t.catch_up, t.queue])
        reply = await self._d._script("task_lead", args)
        return [
            TaskLead(
                name=_s(r[0]),
                leader=_s(r[1]) or None,
                lease_expires_at=_f(r[2]),
                watermark=float(_s(r[3])),
                last_fire=_f(r[4]),
                paused=bool(int(r[5])),
            )
            for r in reply
        ]

    async def fire(self, leader: str, fires: Sequence[TaskFire]) -> builtins.list[str]:
        from ._driver import _request_row

        args = [leader, str(len(fires))]
        for f in fires:
            args.extend(
                [
                    f.name,
                    repr(float(f.watermark)),
                    repr(float(f.through)),
                    "" if f.last_fire is None else "=" + repr(float(f.last_fire)),
                    str(len(f.requests)),
                ]
            )
            for r in f.requests:
                args.extend(_request_row(r))
        landed, queues = await self._d._script("task_fire", args)
        self._d._fire([_s(q) for q in queues])
        return [_s(name) for name in landed]

    async def release(self, leader: str, names: Sequence[str]) -> None:
        await self._d._script("task_release", [leader, *names])

    async def pause(self, name: str) -> None:
        await self._d._script("task_pause", [name])

    async def resume(self, name: str) -> None:
        await self._d._script("task_resume", [name])

    async def rows(self) -> builtins.list[TaskRow]:
        reply = await self._d._script("task_rows", [])
        rows = [
            TaskRow(
                name=_s(r[0]),
                schedule=_s(r[1]),
                tz=_s(r[2]),
                catch_up=_s(r[3]),
                queue=_s(r[4]),
                paused=bool(int(r[5])),
                watermark=float(_s(r[6])),
                armed_at=float(_s(r[7])),
                last_fire=_f(r[8]),
                fired_at=_f(r[9]),
                leader=_s(r[10]) or None,
                lease_expires_at=_f(r[11]),
            )
            for r in reply
        ]
        return sorted(rows, key=lambda r: r.name)

    async def paused(self) -> builtins.list[str]:
        d = self._d
        names = await d._call(d.client.hkeys(f"{d.prefix}:task_paused"), "HKEYS")
        return sorted(_s(n) for n in names)
