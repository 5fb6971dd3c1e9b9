"""The Redis driver's operator surface (``driver.introspect``): what the CLI,
the dashboard and ``jobs.show``/``list``/``cancel``/... read and change.

Each call is one script of ``lua/operate.lua`` (atomic by itself), except
``list``, which reads the creation index in bounded stretches (at most
:data:`LIST_BUDGET` entries a script call, so a page filtered down to few rows
never holds the server for long), and ``resolve_step``, a read then a
compare-and-set. The refusals answer as the memory driver's (the reference):
the same codes, the same messages.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._serialization import dumps, loads
from ...errors import ErrorCode, JobsError
from .._cursor import decode_cursor, encode_cursor
from .._protocol import (
    CANCELLED_LINE,
    MAX_BULK_ROWS,
    BulkAction,
    BulkFilter,
    BulkPreview,
    BulkResult,
    CounterRow,
    JobPage,
    JobView,
    ListFilter,
    StepView,
    WorkerInfo,
)
from .._resolve import check_bulk_action, not_found, resolved_prefix

if TYPE_CHECKING:
    from ._driver import RedisDriver

__all__ = ["LIST_BUDGET", "RedisIntrospection"]

#: The most creation-index entries one ``list`` script call reads.
LIST_BUDGET = 2_000

#: Counter tiers as every driver answers them: (age up to, bucket width).
_TIERS = ((86400.0, 60.0), (7 * 86400.0, 300.0), (30 * 86400.0, 3600.0))


def _s(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


def _float(value: str | None) -> float | None:
    return float(value) if value else None


def _view(reply: Sequence[Any], *, full: bool) -> JobView:
    """A row as ``view`` (operate.lua) answers it: {fields, steps, children}."""
    from ._driver import _attempts_from, _progress, _steps_from

    h = _pairs(reply[0])
    steps: list[StepView] = []
    if full:
        for rec in _steps_from(reply[1]):
            steps.append(
                StepView(
                    rec.name,
                    rec.status,
                    rec.executions,
                    rec.output,
                    rec.error,
                    started_at=rec.started_at,
                    ended_at=rec.ended_at,
                )
            )
    sens = h.get("sens")
    return JobView(
        id=h["id"],
        run_id=h["rid"],
        name=h["name"],
        queue=h["q"],
        state=h["st"],  # type: ignore[arg-type]
        attempts=int(h.get("att") or 0),
        max_attempts=int(h["max"]),
        tenant_id=h.get("tn"),
        idempotency_key=h["key"],
        concurrency_key=h.get("ck"),
        run_at=float(h["run"]),
        created_at=float(h["cr"]),
        error_code=h.get("ec"),
        last_error=h.get("em"),
        progress=_progress(h.get("pg")),
        result=loads(h["rs"]) if "rs" in h else None,
        steps=steps,
        payload=loads(h["pl"]),
        priority=int(h.get("prio") or 0),
        updated_at=_float(h.get("upd")),
        worker_id=h.get("w") if h.get("st") == "running" else None,
        sensitive=None if sens is None else sens == "1",
        attempt_log=tuple(_attempts_from(h)) if full else (),
        parent_id=h.get("par"),
        children=tuple(_s(c) for c in reply[2]) if full else (),
    )


def _state_refusal(code: str, detail: str) -> JobsError:
    """The refusal a script answered (``{0, code, detail}``), worded as the
    reference driver words it."""
    if code == ErrorCode.X_JOB_NOT_FOUND:
        return not_found()
    if code == ErrorCode.X_JOB_NOT_REQUEUEABLE:
        return JobsError(
            ErrorCode.X_JOB_NOT_REQUEUEABLE,
            f"the job is {detail}; only a done, failed, dead or cancelled job can be requeued",
        )
    if code == ErrorCode.X_JOB_DUPLICATE:
        return JobsError(
            ErrorCode.X_JOB_DUPLICATE,
            f"a live job ({detail}) holds this job's idempotency key; wait for it to settle",
            meta={"holder": detail},
        )
    if code == ErrorCode.X_JOB_NOT_CANCELLABLE:
        return JobsError(
            ErrorCode.X_JOB_NOT_CANCELLABLE,
            f"the job already ended {detail}; only a live job can be cancelled",
        )
    if code == ErrorCode.X_JOB_NOT_REMOVABLE:
        return JobsError(
            ErrorCode.X_JOB_NOT_REMOVABLE,
            "the job is running; cancel it first (`trio-jobs cancel ID`), then remove it",
        )
    if detail == "no step":
        return JobsError(
            ErrorCode.X_INVARIANT,
            "the job recorded no step by that name; `trio-jobs show ID` lists its steps",
        )
    return JobsError(
        ErrorCode.X_INVARIANT,
        f"the job is {detail} and not waiting on its run_at; only a delayed job, "
        "or a ready one backing off before a retry, can be promoted",
    )


def _answer(reply: Sequence[Any]) -> Sequence[Any]:
    """A mutation's answer: its view on success; its refusal raised."""
    if not int(reply[0]):
        raise _state_refusal(_s(reply[1]), _s(reply[2]) if len(reply) > 2 else "")
    return reply


def _bulk_args(action: str, apply: bool, f: BulkFilter, sample: int = 0) -> list[str]:
    return [
        action,
        "1" if apply else "0",
        f.state,
        f.queue or "",
        f.name or "",
        "" if f.tenant_id is None else "=" + f.tenant_id,
        str(MAX_BULK_ROWS),
        str(int(sample)),
    ]


class RedisIntrospection:
    """:class:`~trio_jobs.drivers.JobIntrospection` over the Redis driver's keys."""

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def show(self, job_id: str) -> JobView:
        reply = await self._d._script("show", [str(job_id)])
        if not reply:
            raise not_found()
        return _view(reply, full=True)

    async def resolve_id(self, prefix: str) -> str:
        ids = [_s(i) for i in await self._d._script("resolve_id", [prefix])]
        return resolved_prefix(ids, len(ids))

    async def list(self, filter: ListFilter) -> JobPage:
        f = filter  # validated where it was built (ListFilter's validators)
        if f.after is not None:
            direction, mark = "after", decode_cursor(f.after)
        elif f.before is not None:
            direction, mark = "before", decode_cursor(f.before)
        else:
            direction, mark = "first", (0.0, "")
        want = f.limit + 1
        found: builtins.list[JobView] = []
        cursor = (repr(mark[0]), mark[1])
        step = direction
        while len(found) < want:
            rows, last_cr, last_id, done = await self._d._script(
                "list",
                [
                    f.queue or "",
                    f.name or "",
                    f.state or "",
                    "" if f.tenant_id is None else "=" + f.tenant_id,
                    (f.id_prefix or "").lower(),
                    "" if f.created_from is None else repr(float(f.created_from)),
                    "" if f.created_to is None else repr(float(f.created_to)),
                    step,
                    cursor[0],
                    cursor[1],
                    str(want - len(found)),
                    str(LIST_BUDGET),
                ],
            )
            found.extend(_view(r, full=False) for r in rows)
            if int(done):
                break
            cursor = (_s(last_cr), _s(last_id))
            step = "before" if direction == "before" else "after"
        if direction == "before":
            page = found[: f.limit]
            has_prev = len(found) > f.limit
            has_more = True
            page.reverse()
        else:
            page = found[: f.limit]
            has_more = len(found) > f.limit
            has_prev = direction == "after"
        after = encode_cursor(page[-1].created_at, page[-1].id) if page and has_more else None
        before = encode_cursor(page[0].created_at, page[0].id) if page and has_prev else None
        return JobPage(rows=page, after=after, before=before)

    async def requeue(self, job_id: str, from_step: str | None = None) -> JobView:
        reply = _answer(await self._d._script("requeue", [str(job_id), from_step or ""]))
        self._d._fire([_view(reply[1], full=False).queue])
        return _view(reply[1], full=True)

    async def cancel(self, job_id: str, reason: str | None = None) -> JobView:
        message = f"{ErrorCode.X_ABORTED}: cancelled" + (f": {reason}" if reason else "")
        child = f"{ErrorCode.X_ABORTED}: cancelled: its parent was cancelled"
        reply = _answer(
            await self._d._script("cancel", [str(job_id), message, CANCELLED_LINE, child])
        )
        return _view(reply[1], full=True)

    async def remove(self, job_id: str) -> None:
        _answer(await self._d._script("remove", [str(job_id)]))

    async def _bulk(self, action: BulkAction, filter: BulkFilter) -> BulkResult:
        check_bulk_action(action, filter)
        moved, remaining = await self._d._script("bulk", _bulk_args(action, True, filter))
        if action != "remove" and int(moved) and self._d.wake is not None:
            self._d.wake.fire([filter.queue] if filter.queue else None)
        return BulkResult(affected=int(moved), remaining=int(remaining))

    async def remove_many(self, filter: BulkFilter) -> BulkResult:
        return await self._bulk("remove", filter)

    async def requeue_many(self, filter: BulkFilter) -> BulkResult:
        return await self._bulk("requeue", filter)

    async def promote(self, job_id: str) -> JobView:
        reply = _answer(await self._d._script("promote", [str(job_id)]))
        view = _view(reply[1], full=True)
        self._d._fire([view.queue])
        return view

    async def promote_many(self, filter: BulkFilter) -> BulkResult:
        return await self._bulk("promote", filter)

    async def preview_many(
        self, action: BulkAction, filter: BulkFilter, sample: int
    ) -> BulkPreview:
        check_bulk_action(action, filter)
        count, rows = await self._d._script("bulk", _bulk_args(action, False, filter, sample))
        return BulkPreview(count=int(count), sample=[_view(r, full=False) for r in rows])

    async def resolve_step(self, job_id: str, step: str, *, ran: bool, output: Any = None) -> None:
        from ._driver import _step_body, _steps_from

        reply = await self._d._script("show", [str(job_id)])
        if not reply:
            raise not_found()
        state = _pairs(reply[0]).get("st")
        if state == "running":
            raise JobsError(
                ErrorCode.X_INVARIANT, "the job is running; resolve its step once it has stopped"
            )
        raw = _pairs(reply[1]).get(step)
        records = {r.name: r for r in _steps_from(reply[1])}
        rec = records.get(step)
        if raw is None or rec is None or rec.status not in ("started", "failed"):
            raise JobsError(
                ErrorCode.X_INVARIANT,
                "only a `once` step whose outcome is unknown (started or failed) can be resolved",
            )
        new = ""
        if ran:
            import attrs

            done = attrs.evolve(rec, status="completed", output=output, error=None, error_code=None)
            new = f"{rec.seq}\n{_step_body(done)}"
        answer = _s(await self._d._script("resolve_step", [str(job_id), step, raw, new]))
        if answer == "running":
            raise JobsError(
                ErrorCode.X_INVARIANT, "the job is running; resolve its step once it has stopped"
            )
        if answer == "gone":
            raise not_found()
        if answer == "changed":
            raise JobsError(
                ErrorCode.X_INVARIANT,
                "the step's record changed while it was being resolved (the job ran "
                "again); `trio-jobs show ID` shows it now — resolve it again if it still "
                "needs it",
            )

    async def pause_queue(self, queue: str) -> None:
        await self._d.pause_queue(queue)

    async def resume_queue(self, queue: str) -> None:
        await self._d.resume_queue(queue)

    async def paused_queues(self) -> builtins.list[str]:
        return await self._d.paused_queues()

    async def record_worker(self, info: WorkerInfo, ttl: float) -> None:
        body = dumps(
            {
                "id": info.id,
                "host": info.host,
                "pid": info.pid,
                "started_at": info.started_at,
                "queues": list(info.queues),
                "slots": dict(info.slots),
                "in_flight": list(info.in_flight),
            }
        ).decode()
        await self._d._script("worker_put", [info.id, body, repr(float(ttl))])

    async def remove_worker(self, worker_id: str) -> None:
        await self._d._script("worker_remove", [worker_id])

    async def workers(self) -> builtins.list[WorkerInfo]:
        out = []
        for value in await self._d._script("workers", []):
            at, _, body = _s(value).partition("\n")
            data = loads(body)
            out.append(
                WorkerInfo(
                    id=data["id"],
                    host=data["host"],
                    pid=int(data["pid"]),
                    started_at=float(data["started_at"]),
                    queues=list(data["queues"]),
                    slots={k: int(v) for k, v in data["slots"].items()},
                    in_flight=list(data["in_flight"]),
                    last_heartbeat=float(at),
                )
            )
        return sorted(out, key=lambda w: w.started_at)

    async def counters(self, name: str | None, since: float) -> builtins.list[CounterRow]:
        """The minute buckets (kept 31 days) folded into the tiers every driver
        answers: minutes for a day, five minutes for a week, hours for 30 days."""
        now = self._d.now()
        merged: dict[tuple[float, str], list[float]] = {}
        queues: dict[tuple[float, str], str] = {}
        for row in await self._d.counters(name, since):
            age = now - row.bucket
            if age > _TIERS[-1][0]:
                continue
            width = next((w for limit, w in _TIERS if age <= limit), 60.0)
            tier = math.floor(row.bucket / width) * width
            acc = merged.setdefault((tier, row.name), [0, 0, 0, 0, 0.0])
            for i, v in enumerate((row.done, row.retried, row.failed, row.dead, row.duration)):
                acc[i] += v
            if row.queue is not None:
                queues[(tier, row.name)] = row.queue
        return [
            CounterRow(
                b, n, int(c[0]), int(c[1]), int(c[2]), int(c[3]), c[4], queue=queues.get((b, n))
            )
            for (b, n), c in sorted(merged.items())
        ]

    async def purge(self, done_before: float, dead_before: float, limit: int) -> int:
        return int(
            await self._d._script(
                "purge", [repr(float(done_before)), repr(float(dead_before)), str(int(limit))]
            )
        )
