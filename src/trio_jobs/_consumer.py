"""``consumer()``: read a stream per key, commit each batch with its cursor.

A consumer is a job (``kind == "consumer"``) whose input is a key (a string)
plus two companions registered with it: the scheduled task ``<name>.supervisor``
(a cron at ``rearm``, UTC) that enqueues the job ``<name>.arm``, which asks
``keys()`` and enqueues one run per key. One run per key holds at a time
(``Concurrency(1, key=<the key>, when_busy="wait")``) and one live row per key
(the built-in idempotency key ``consumer:<name>:<key>``), so arming again is a
no-op while a key runs and a restart once it has stopped.

A run loads its key's cursor (``load_cursor(key, tx)``), opens the app's stream
from there (``open(key, cursor, signal)``) and reads it in batches of at most
``batch`` items; a part-filled batch commits once no next item came for
:data:`LINGER` seconds. A batch commits through ``step.transaction``'s
machinery: ``handle(batch)`` answers the cursor past the batch, and
``save_cursor(key, cursor, tx)`` writes it in the **same** transaction, with the
run's fenced step record, so a crash, a lost lease or a drain can neither lose
nor double the cursor's move. That record is one rolling step, ``batch``,
rewritten by every batch (a long-lived run's records stay one row): its output
is ``{"cursor", "batches", "items"}`` and its end time is the last batch's.

Delivery is at least once: items read and not yet committed (a drain, a crash,
a failed batch) are read again by the next run from the committed cursor.
"""

from __future__ import annotations

import builtins
import contextvars
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from . import _tracing
from ._context import RunState, Signal, _call, _running, _transact
from ._declare import (
    Concurrency,
    Enqueued,
    Job,
    check_factory_name,
    check_function,
    job,
    refuse_declaration,
)
from ._enqueue import _MISSING
from ._facade import Transaction
from ._task import Occurrence, Task, task
from ._time import parse_duration
from ._validate import text_fault
from .drivers._protocol import MAX_ENQUEUE_BATCH, JobView
from .errors import ErrorCode, JobDeclarationError, JobsError
from .logging import emit

if TYPE_CHECKING:
    from ._context import JobContext
    from ._enqueue import Actor
    from ._facade import Jobs

__all__ = [
    "BATCH_STEP",
    "LINGER",
    "Consumer",
    "ConsumerBatch",
    "ConsumerRow",
    "consumer",
    "consumer_info",
    "consumer_rows",
]

log = logging.getLogger("trio_jobs")

#: CONSUMER_LINGER_MS: a part-filled batch commits once no next item came this long.
LINGER = 0.050
#: The rolling step record each batch rewrites (its output: cursor, batches, items).
BATCH_STEP = "batch"
#: The note of the progress a consumer with ``lag=`` reports: ``(done, done + lag)``.
LAG_NOTE = "consumer lag"
#: The longest consumer name (its companions append ``.supervisor``; a job name is 200).
MAX_NAME = 189
#: The longest key ``keys()`` may answer (a concurrency key).
MAX_KEY = 200
#: Suffixes of the companions a consumer registers.
SUPERVISOR_SUFFIX = ".supervisor"
ARM_SUFFIX = ".arm"
#: The most runs of one key the dashboard reads to find its last batch.
LOOK_BACK = 5

#: The consumer whose ``open``/``handle`` runs in this context (a self-enqueue is refused).
_inside: contextvars.ContextVar[Consumer | None] = contextvars.ContextVar(
    "trio_jobs_consumer", default=None
)


@attrs.frozen
class ConsumerBatch:
    """One batch a consumer's ``handle`` receives.

    ``key`` is the run's key; ``items`` the batch (at most ``batch`` items, in
    stream order); ``cursor`` the committed cursor before the batch (``None``
    before the first one ever); ``tx`` the batch's transaction (a
    :class:`~trio_jobs.Transaction`: write through ``tx.execute`` so the effects
    commit with the cursor; enqueues inside ``handle`` join it); ``signal`` the
    run's abort :class:`~trio_jobs.Signal`."""

    key: str
    items: Sequence[Any]
    cursor: str | None
    tx: Transaction
    signal: Signal


@attrs.frozen
class ConsumerRow:
    """One key of a consumer as the dashboard lists it: its newest run."""

    name: str
    key: str
    job_id: str
    state: str
    last_batch_at: float | None
    lag: float | None


# --------------------------------------------------------------------------- checks


def _check_rearm(rearm: object, faults: list[str]) -> int | None:
    """``rearm`` as whole minutes dividing an hour (1, 2, 3, 4, 5, 6, 10, 12, 15,
    20, 30 or 60), or a fault."""
    fault = (
        "rearm must be whole minutes dividing an hour (1m, 2m, 3m, 4m, 5m, 6m, 10m, 12m, "
        '15m, 20m, 30m or 60m; "1m" by default)'
    )
    try:
        seconds = parse_duration(rearm, field="rearm")
    except JobsError:
        faults.append(fault)
        return None
    minutes = seconds / 60
    if not minutes.is_integer() or not 1 <= minutes <= 60 or 60 % int(minutes):
        faults.append(fault)
        return None
    return int(minutes)


def _cron_of(minutes: int) -> str:
    return "0 * * * *" if minutes == 60 else f"*/{minutes} * * * *"


def _invalid(name: str, message: str) -> JobsError:
    return JobsError(ErrorCode.X_CONSUMER_INVALID, f"consumer {name!r}: {message}")


def _cursor(name: str, value: object, what: str) -> str | None:
    """A cursor as the app answered it: a string, or ``None`` (``load_cursor``
    only: no cursor yet). Refused by type only, never echoed."""
    if value is None and what == "load_cursor":
        return None
    if not isinstance(value, str):
        shape = "a string or None" if what == "load_cursor" else "a string (the cursor past it)"
        raise _invalid(name, f"{what} must answer {shape}; it answered a {type(value).__name__}")
    fault = text_fault(value)
    if fault is not None:
        raise _invalid(name, f"the cursor {what} answered cannot be stored: {fault}")
    return value


# --------------------------------------------------------------------------- the seam


async def save_in_batch(handle: Consumer, key: str, cursor: str, tx: Transaction) -> None:
    """Save the cursor past a batch in the batch's own transaction ``tx`` (the
    one ``handle`` wrote through): the pair commits or rolls back together."""
    await _call(handle.save_cursor, key, cursor, tx)


# --------------------------------------------------------------------------- the handle


class Consumer(Job[str, dict[str, int]]):
    """The handle :func:`consumer` returns: a :class:`~trio_jobs.Job` with
    ``.kind == "consumer"`` whose input is a key. ``.supervisor`` (the task
    ``<name>.supervisor``) and ``.arm_job`` (the job ``<name>.arm``) are
    registered with it wherever it is listed; ``await handle.arm()`` enqueues
    one run per key now."""

    kind = "consumer"

    def __init__(
        self,
        base: Job[Any, Any],
        *,
        keys: Callable[[], Any],
        open: Callable[[str, str | None, Signal], Any],
        handle: Callable[[ConsumerBatch], Any],
        load_cursor: Callable[[str, Transaction], Any],
        save_cursor: Callable[[str, str, Transaction], Any],
        batch: int,
        rearm: int,
        lag: Callable[[str, str | None], Any] | None,
    ) -> None:
        self.__dict__.update(base.__dict__)
        self.keys = keys
        self.open = open
        self.handle = handle
        self.load_cursor = load_cursor
        self.save_cursor = save_cursor
        self.batch = batch
        #: Minutes between two arms (they divide an hour; UTC).
        self.rearm = rearm
        self.lag = lag
        self._idempotency_key = self._key
        self.run = self._run
        self.arm_job: Job[None, int] = job(
            name=f"{self.name}{ARM_SUFFIX}",
            idempotency_key=lambda _none: f"consumer-arm:{self.name}",
            queue=self.queue,
        )(self._arm_body)
        self.supervisor: Task = task(
            cron=_cron_of(rearm),
            tz="UTC",
            catch_up="latest",
            name=f"{self.name}{SUPERVISOR_SUFFIX}",
            queue=self.queue,
        )(self._supervise)
        self.companions = (self.supervisor, self.arm_job)

    def _key(self, key: str) -> str:
        return f"consumer:{self.name}:{key}"

    def __repr__(self) -> str:
        return (
            f"<consumer {self.name!r} batch={self.batch} rearm={self.rearm}m queue={self.queue!r}>"
        )

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["consumer"] = {
            "batch": self.batch,
            "rearm": f"{self.rearm}m",
            "supervisor": self.supervisor.name,
            "arm": self.arm_job.name,
            "lag": self.lag is not None,
        }
        return out

    # ------------------------------------------------------------------ enqueue

    def _refuse_self(self) -> None:
        if _inside.get() is self:
            raise JobsError(
                ErrorCode.X_CONSUMER_SELF_ENQUEUE,
                f"consumer {self.name!r}: handle or open enqueued the consumer itself; that "
                "dedupes onto the running row and arms nothing. Return the cursor past the "
                "batch instead: the supervisor re-arms each key every rearm",
                meta={"consumer": self.name},
            )

    async def enqueue(self, input: str, **options: Any) -> Enqueued:
        self._refuse_self()
        return await super().enqueue(input, **options)

    async def enqueue_many(self, inputs: Iterable[str], **options: Any) -> builtins.list[Enqueued]:
        self._refuse_self()
        return await super().enqueue_many(inputs, **options)

    async def enqueue_as(self, actor: Actor | None, input: str, **options: Any) -> Enqueued:
        self._refuse_self()
        return await super().enqueue_as(actor, input, **options)

    async def arm(self) -> builtins.list[Enqueued]:
        """Enqueue one run per key ``keys()`` answers, now (what ``<name>.arm``
        does): a key already running dedupes onto its live row."""
        self._refuse_self()
        keys = await self._keys()
        out: builtins.list[Enqueued] = []
        for start in range(0, len(keys), MAX_ENQUEUE_BATCH):
            out += await super().enqueue_many(keys[start : start + MAX_ENQUEUE_BATCH])
        return out

    async def _keys(self) -> builtins.list[str]:
        answer = await _call(self.keys)
        if isinstance(answer, str | bytes | Mapping) or not isinstance(answer, Iterable):
            raise _invalid(
                self.name,
                f"keys() must answer a list of keys (strings); it answered a "
                f"{type(answer).__name__}",
            )
        keys = builtins.list(answer)
        faults = []
        for i, key in enumerate(keys):
            if not isinstance(key, str) or not key or len(key) > MAX_KEY:
                faults.append(f"key {i} must be a non-empty string of at most {MAX_KEY} characters")
            elif (fault := text_fault(key)) is not None:
                faults.append(f"key {i} cannot be stored: {fault}")
        if faults:
            raise JobsError(
                ErrorCode.X_CONSUMER_INVALID,
                f"consumer {self.name!r}: keys() answered keys that cannot run (nothing was "
                "armed): " + "; ".join(faults[:10]),
                meta={"faults": faults[:10]},
            )
        return builtins.list(dict.fromkeys(keys))

    async def _arm_body(self, ctx: JobContext[None]) -> int:
        return len(await self.arm())

    async def _supervise(self, ctx: JobContext[Occurrence]) -> str:
        return (await self.arm_job.enqueue(None)).id

    # ------------------------------------------------------------------ the run

    async def _run(self, ctx: JobContext[str]) -> dict[str, int]:
        token = _inside.set(self)
        try:
            return await self._consume(ctx, ctx.input)
        finally:
            _inside.reset(token)

    async def _consume(self, ctx: JobContext[str], key: str) -> dict[str, int]:
        state = ctx._state
        async with ctx.jobs.transaction() as tx:
            cursor = _cursor(self.name, await _call(self.load_cursor, key, tx), "load_cursor")
        batches = items = 0
        prev = state.records.get(BATCH_STEP)
        if prev is not None and prev.status == "completed" and isinstance(prev.output, dict):
            batches, items = int(prev.output["batches"]), int(prev.output["items"])
        send, recv = trio.open_memory_channel[Any](0)

        async def read() -> None:
            async with send:
                source = await _call(self.open, key, cursor, ctx.signal)
                if hasattr(source, "__aiter__"):
                    async for item in source:
                        await send.send(item)
                elif isinstance(source, Iterable) and not isinstance(source, str | bytes | Mapping):
                    for item in source:
                        await send.send(item)
                else:
                    raise _invalid(
                        self.name,
                        "open must answer an async iterable of items (or an iterable); it "
                        f"answered a {type(source).__name__}",
                    )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            async with recv:
                while True:
                    found, ended = await _next_batch(recv, self.batch)
                    if found:
                        cursor = await self._commit(ctx, state, key, found, cursor, batches, items)
                        batches += 1
                        items += len(found)
                        await self._report_lag(ctx, key, cursor, items)
                    if ended:
                        break
        return {"batches": batches, "items": items}

    async def _commit(
        self,
        ctx: JobContext[str],
        s: RunState,
        key: str,
        found: builtins.list[Any],
        before: str | None,
        batches: int,
        items: int,
    ) -> str | None:
        """One batch: ``handle`` then the cursor, in one transaction with the
        run's fenced ``batch`` record (``step.transaction``'s machinery)."""
        s.refuse_past_abort(BATCH_STEP)
        prev = s.records.get(BATCH_STEP)
        executions = (prev.executions if prev is not None else 0) + 1
        seq = s.seq_for(BATCH_STEP)
        name = self.name

        async def commit(tx: Transaction) -> dict[str, Any]:
            batch = ConsumerBatch(key, tuple(found), before, tx, ctx.signal)
            nxt = _cursor(name, await _call(self.handle, batch), "handle")
            assert nxt is not None
            await save_in_batch(self, key, nxt, tx)
            return {"cursor": nxt, "batches": batches + 1, "items": items + len(found)}

        await s.hit("before-step", BATCH_STEP)
        s.running_steps[BATCH_STEP] = s.driver.now()
        with _tracing.step_span(BATCH_STEP, executions, False, s.traced), _running(s, BATCH_STEP):
            record = await _transact(s, BATCH_STEP, commit, seq, executions, None)
        s.records[BATCH_STEP] = record
        await s.hit("after-record", BATCH_STEP)
        return str(record.output["cursor"])

    async def _report_lag(
        self, ctx: JobContext[str], key: str, cursor: str | None, done: int
    ) -> None:
        """``progress(done, done + lag)`` when ``lag=`` is declared. A lag that
        fails or answers no count is logged and skipped: it only informs."""
        if self.lag is None:
            return
        fault: dict[str, Any] | None = None
        try:
            behind = await _call(self.lag, key, cursor)
        except Exception as exc:
            fault = {
                "error_type": type(exc).__name__,
                "code": exc.code if isinstance(exc, JobsError) else None,
            }
        else:
            if (
                isinstance(behind, bool)
                or not isinstance(behind, int | float)
                or not math.isfinite(behind)
                or behind < 0
            ):
                fault = {
                    "error_type": type(behind).__name__,
                    "hint": "lag(key, cursor) must answer a finite count of 0 or more",
                }
        if fault is not None:
            emit(
                log,
                logging.WARNING,
                "jobs.consumer.lag-failed",
                job_id=ctx.job_id,
                job=self.name,
                **fault,
            )
            return
        ctx.progress(done, done + behind, LAG_NOTE)


async def _next_batch(
    recv: trio.MemoryReceiveChannel[Any], size: int
) -> tuple[builtins.list[Any], bool]:
    """The next batch: wait for its first item as long as it takes, then take
    more until it holds ``size`` or no next item came for :data:`LINGER`.
    Answers the items and whether the stream ended."""
    try:
        first = await recv.receive()
    except trio.EndOfChannel:
        return [], True
    found = [first]
    while len(found) < size:
        with trio.move_on_after(LINGER):
            try:
                found.append(await recv.receive())
            except trio.EndOfChannel:
                return found, True
            continue
        break
    return found, False


# --------------------------------------------------------------------------- consumer()


def consumer(
    *args: Any,
    name: Any = _MISSING,
    tenant: Any = "none",
    keys: Any = _MISSING,
    open: Any = _MISSING,
    handle: Any = _MISSING,
    load_cursor: Any = _MISSING,
    save_cursor: Any = _MISSING,
    batch: Any = 100,
    rearm: Any = "1m",
    lag: Any = None,
    retry: Any = None,
    queue: Any = "default",
    **forbidden: Any,
) -> Consumer:
    """Declare a consumer: one run per key reads the app's stream from its
    cursor and commits each batch with the cursor past it.

    ``keys()`` answers the keys that should be running (sync or async);
    ``open(key, cursor, signal)`` the key's stream from ``cursor`` (an async
    iterable, or an iterable, of items; ``cursor`` is ``None`` before the first
    batch); ``handle(batch)`` handles a :class:`ConsumerBatch` and answers the
    cursor past it (a string); ``load_cursor(key, tx)`` answers the committed
    cursor (a string or ``None``); ``save_cursor(key, cursor, tx)`` saves one,
    called in the **same** transaction as ``handle``. ``batch`` is the most
    items per batch (a part-filled batch commits after 50 ms without a next
    item); ``rearm`` (whole minutes dividing an hour, UTC) is how often the
    supervisor ``<name>.supervisor`` arms every key; ``lag(key, cursor)``
    (optional) answers how many items the key is behind, reported as the run's
    progress ``(done, done + lag)``. ``tenant`` is ``"none"`` or a function of
    the key; ``retry`` and ``queue`` are as for :func:`~trio_jobs.job`.

    Every argument is a keyword. A fault (a missing or forbidden argument
    among them: ``timeout``, ``concurrency``, ``idempotency_key``) is one
    ``X_CONSUMER_INVALID`` naming every fault. Delivery is at least once: make
    ``handle`` idempotent per item.

    >>> sync_orders = consumer(
    ...     name="sync-orders",
    ...     keys=lambda: ["acct-1", "acct-2"],
    ...     open=lambda key, cursor, signal: vendor.stream(key, cursor),
    ...     handle=handle,
    ...     load_cursor=load_cursor,
    ...     save_cursor=save_cursor,
    ...     batch=100,
    ...     rearm="1m",
    ... )
    """
    faults: list[str] = []
    if args:
        faults.append(
            f"consumer() takes keyword arguments only; it was given {len(args)} positional "
            "(write name=..., keys=..., open=..., handle=..., load_cursor=..., save_cursor=...)"
        )
    for field, why in (
        (
            "timeout",
            "a consumer has no timeout: a run ends when its stream ends or a drain stops it",
        ),
        ("step_timeout", "a consumer has no step_timeout: a batch ends when handle returns"),
        ("concurrency", "a consumer's concurrency is fixed: one run per key"),
        ("idempotency_key", "a consumer's idempotency key is built in: consumer:<name>:<key>"),
    ):
        if field in forbidden:
            faults.append(f"{field}= is refused: {why}")
            del forbidden[field]
    if forbidden:
        faults.append(f"unknown argument(s): {', '.join(sorted(forbidden))}")
    name_ok = check_factory_name(
        name, MAX_NAME, "the consumer's durable name (its queue key)", faults
    )
    if not (tenant == "none" or callable(tenant)):
        faults.append("tenant must be 'none' or a function of the key")
    check_function(keys, "keys", 0, "keys() answering the keys that should be running", faults)
    check_function(open, "open", 3, "open(key, cursor, signal) answering the key's stream", faults)
    check_function(handle, "handle", 1, "handle(batch) answering the cursor past the batch", faults)
    check_function(
        load_cursor, "load_cursor", 2, "load_cursor(key, tx) answering the cursor or None", faults
    )
    check_function(
        save_cursor,
        "save_cursor",
        3,
        "save_cursor(key, cursor, tx) saving it in the batch's transaction",
        faults,
    )
    if lag is not None:
        check_function(
            lag, "lag", 2, "lag(key, cursor) answering how many items are behind", faults
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        faults.append("batch must be a whole number, 1 or more (the most items per batch)")
    minutes = _check_rearm(rearm, faults)
    base: Job[Any, Any] | None = None
    try:
        base = job(
            name=name if name_ok else "consumer",
            input=str,
            tenant=tenant if (tenant == "none" or callable(tenant)) else "none",
            idempotency_key=lambda _key: "",  # replaced by the built-in key
            queue=queue,
            retry=retry,
            concurrency=Concurrency(1, key=lambda key: key, when_busy="wait"),
        )(_placeholder)
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or base is None or minutes is None:
        raise refuse_declaration(ErrorCode.X_CONSUMER_INVALID, "consumer", faults)
    made = Consumer(
        base,
        keys=keys,
        open=open,
        handle=handle,
        load_cursor=load_cursor,
        save_cursor=save_cursor,
        batch=batch,
        rearm=minutes,
        lag=lag,
    )
    made.__doc__ = f"The consumer {made.name!r}: one run per key reads its stream in batches."
    made.__name__ = made.__qualname__ = made.name
    return made


async def _placeholder(ctx: Any) -> dict[str, int]:  # replaced by Consumer._run
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- operating


def _signature(view: JobView) -> str | None:
    """The key of a consumer run told by its row alone: its idempotency key is
    ``consumer:<its name>:<its payload>``."""
    payload = view.payload
    if isinstance(payload, str) and view.idempotency_key == f"consumer:{view.name}:{payload}":
        return payload
    return None


def consumer_info(view: JobView) -> dict[str, Any] | None:
    """``JobView.consumer`` for a consumer run: ``{key, last_batch_at, lag}``
    (``last_batch_at``: when its last batch committed, Unix seconds, or
    ``None``; ``lag``: what ``lag=`` last answered, or ``None``)."""
    key = _signature(view)
    if key is None:
        return None
    last = None
    for step in view.steps:
        if step.name == BATCH_STEP and step.status == "completed":
            last = step.ended_at
    progress = view.progress
    lag = None
    if progress is not None and progress.note == LAG_NOTE:
        lag = max(0.0, progress.total - progress.done)
    return {"key": key, "last_batch_at": last, "lag": lag}


def with_consumer(view: JobView) -> JobView:
    info = consumer_info(view)
    return view if info is None else attrs.evolve(view, consumer=info)


async def consumer_rows(jobs: Jobs, *, limit: int = 200) -> builtins.list[ConsumerRow]:
    """Each key of each consumer by its newest run (its id and state), with the
    last batch and lag of its newest run that committed one (a run that found
    nothing new commits none; at most :data:`LOOK_BACK` runs are read per key).
    The consumers are those the facade declares and those whose supervisor the
    task store knows (the dashboard runs without the app's module)."""
    names = {h.name for h in jobs.handles.values() if isinstance(h, Consumer)}
    driver = await jobs._resolved_driver()
    if driver.tasks is not None:
        names |= {
            r.name[: -len(SUPERVISOR_SUFFIX)]
            for r in await driver.tasks.rows()
            if r.name.endswith(SUPERVISOR_SUFFIX)
        }
    rows: builtins.list[ConsumerRow] = []
    for name in sorted(names):
        runs: dict[str, builtins.list[JobView]] = {}
        page = await jobs.list(name=name, limit=limit)
        for view in page.rows:  # newest first
            key = _signature(view)
            if key is not None:
                runs.setdefault(key, []).append(view)
        for key in sorted(runs):
            newest = runs[key][0]
            info: Mapping[str, Any] = {}
            for view in runs[key][:LOOK_BACK]:
                shown = with_consumer(await jobs.show(view.id))
                if shown.consumer is not None and shown.consumer["last_batch_at"] is not None:
                    info = shown.consumer
                    break
            rows.append(
                ConsumerRow(
                    name=name,
                    key=key,
                    job_id=newest.id,
                    state=newest.state,
                    last_batch_at=info.get("last_batch_at"),
                    lag=info.get("lag"),
                )
            )
    return rows
