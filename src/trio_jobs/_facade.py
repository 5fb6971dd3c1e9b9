"""The facade: ``open_jobs``, the ambient facade, transactions, tenancy and actors."""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import trio

from . import _ambient
from ._declare import Job, check_job_list
from ._enqueue import (
    CROSS_TENANT_PERMISSION,
    Actor,
    _epoch,
    confining_org,
    current_facade,
    enqueue_inputs,
    job_ref,
)
from ._lifetime import DriverLifetimes
from ._serialization import payload_form
from ._time import IdSource, UuidSource
from ._validate import check_text
from .drivers._protocol import (
    MAX_BULK_ROWS,
    MAX_PREVIEW_SAMPLE,
    BulkAction,
    BulkFilter,
    BulkPreview,
    BulkResult,
    CounterRow,
    DriverTransaction,
    JobDriver,
    JobIntrospection,
    JobPage,
    JobView,
    ListFilter,
    QueueStats,
    WorkerInfo,
)
from .errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from ._task import TaskView
    from .drivers._backfills import BackfillRow
    from .outbox import OutboxStore

__all__ = [
    "Actor",
    "Jobs",
    "Transaction",
    "acting_as",
    "cross_tenant",
    "current_jobs",
    "open_jobs",
    "publish_event",
    "set_job_driver",
]


@contextlib.contextmanager
def acting_as(actor: Actor | None) -> Iterator[Actor | None]:
    """Make ``actor`` the ambient actor for the block.

    Under an actor with an ``org_id``, every enqueue is checked against that org
    (a row of another org is ``X_JOB_TENANT_MISMATCH``) and the operator surface
    (``jobs.show``, ``list``, ``cancel``, the bulk forms, ...) sees and touches only
    that org's rows; calls that span every org (``stats``, ``workers``,
    ``counters``, pausing a queue) are ``X_FORBIDDEN``. ``cross_tenant(reason)``
    lifts both for an actor holding ``tenancy:cross``. ``acting_as(None)`` acts as
    no one: the operator's view, as the CLI and the dashboard have.
    """
    token = _ambient.actor_var.set(actor)
    try:
        yield actor
    finally:
        _ambient.actor_var.reset(token)


@contextlib.contextmanager
def cross_tenant(reason: str) -> Iterator[None]:
    """Lift the ambient actor's confinement to its org for the enclosed calls.

    Enqueues may name another org's tenant (``tenant_id=``, an input declaring
    it, ``enqueue_as``), and the operator surface sees every org's rows, as with
    no actor. The ambient actor must hold the ``tenancy:cross`` permission
    (``X_FORBIDDEN`` otherwise) and ``reason`` must say why (``X_INVARIANT`` when
    blank). A ``tenant_id=`` or ``enqueue_as`` actor that contradicts the input's
    declared tenant is never admitted.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise JobsError(ErrorCode.X_INVARIANT, "cross_tenant(reason) needs a reason saying why")
    actor = _ambient.actor_var.get()
    if actor is None or CROSS_TENANT_PERMISSION not in actor.permissions:
        raise JobsError(
            ErrorCode.X_FORBIDDEN,
            f"cross_tenant needs an ambient actor holding the {CROSS_TENANT_PERMISSION!r} permission",
        )
    token = _ambient.cross_tenant_var.set(reason)
    try:
        yield
    finally:
        _ambient.cross_tenant_var.reset(token)


class Transaction:
    """A Trio-side handle on the app's own transaction.

    ``await tx.execute(sql, params)`` runs a statement in it; enqueues and
    ``publish_event`` inside the block join it. Leaving the block commits; an
    exception rolls back and every job enqueued in it never existed.
    """

    def __init__(self, jobs: Jobs, driver_tx: DriverTransaction) -> None:
        self.jobs = jobs
        self._tx = driver_tx

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        _ambient.check_not_aborted()
        return await self._tx.execute(sql, params)

    @property
    def driver_tx(self) -> DriverTransaction:
        return self._tx


_default_driver: list[JobDriver] = []


def set_job_driver(driver: JobDriver) -> None:
    """Swap the driver with zero job-code change.

    Inside ``open_jobs`` it swaps the ambient facade's driver for the rest of the
    block (the caller opens and closes the new driver with ``open_jobs``'s own
    lifetime); outside, it sets the driver ``open_jobs()`` uses when given none.
    """
    if not _is_driver(driver):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, "set_job_driver takes a driver, e.g. memory_driver()"
        )
    facade = _ambient.facade_var.get()
    if facade is not None:
        facade._pending_driver = driver
    else:
        _default_driver[:] = [driver]


def _is_driver(obj: object) -> bool:
    return all(
        hasattr(obj, m) for m in ("enqueue_many", "claim", "ack", "nack", "heartbeat", "steps")
    )


class Jobs:
    """The facade ``open_jobs`` yields: enqueue plumbing, transactions and the
    operator surface (the spec's ``JobIntrospection``)."""

    def __init__(
        self,
        driver: JobDriver,
        jobs: Sequence[Job[Any, Any]],
        *,
        ids: IdSource | None = None,
        outbox: OutboxStore | None = None,
    ) -> None:
        self.driver = driver
        self.handles: dict[str, Job[Any, Any]] = check_job_list(jobs)
        self.ids: IdSource = ids if ids is not None else UuidSource()
        self._pending_driver: JobDriver | None = None
        #: The drivers open_jobs holds open in its nursery (None outside it).
        self._lifetimes: DriverLifetimes | None = None
        #: Where ``transaction()`` stages enqueues when the queue is not in the
        #: app's database (``open_jobs(..., outbox=postgres_outbox(dsn))``).
        self.outbox = outbox

    def __repr__(self) -> str:
        return f"<Jobs driver={self.driver.name!r} jobs={len(self.handles)}>"

    def handle(self, name: str) -> Job[Any, Any] | None:
        return self.handles.get(name)

    def register(self, handle: Job[Any, Any]) -> None:
        """Add a job handle after ``open_jobs`` (a worker serving it needs it here)."""
        self.handles = check_job_list([*self.handles.values(), handle])

    async def _resolved_driver(self) -> JobDriver:
        """The driver calls go to: a driver set_job_driver() swapped in is opened
        here by its first use (held with the block under open_jobs)."""
        pending = self._pending_driver
        if pending is not None and pending is not self.driver:
            lifetimes = self._lifetimes
            if lifetimes is None:
                await pending.open()  # a facade built outside open_jobs
            elif not lifetimes.holds(pending):
                await lifetimes.open(pending)
            self.driver = pending
            self._pending_driver = None
        return self.driver

    # ------------------------------------------------------------------ transactions

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """Open a transaction that enqueues and ``publish_event`` join.

        Nested calls join the outer transaction."""
        outer = _ambient.tx_var.get()
        if outer is not None and outer.jobs is self:
            yield outer
            return
        _ambient.check_not_aborted()
        # With an outbox the transaction is the app's database's, and enqueues stage there.
        source = self.outbox if self.outbox is not None else await self._resolved_driver()
        async with source.transaction() as driver_tx:
            tx = Transaction(self, driver_tx)
            token = _ambient.tx_var.set(tx)
            try:
                yield tx
            finally:
                _ambient.tx_var.reset(token)

    # ------------------------------------------------------------------ events

    async def publish_event(self, event: str, payload: Any) -> None:
        await publish_event(event, payload)

    # ------------------------------------------------------------------ operator surface

    async def _introspect(self) -> JobIntrospection:
        driver = await self._resolved_driver()  # a driver set_job_driver() swapped in answers
        intro = driver.introspect
        if intro is None:
            raise JobsError(
                ErrorCode.X_NOT_IMPLEMENTED,
                f"the {driver.name} driver has no operator surface; use postgres_driver() "
                "(or memory_driver() in a test)",
            )
        return intro

    # Under an ambient actor of an org (acting_as), the operator surface is
    # confined to that org's rows: a row of another org is "not found" (its
    # existence is not confirmed), a filter naming another org is a mismatch, and
    # a call spanning every org is forbidden. Checked here, over any driver.

    @staticmethod
    def _confined_tenant(tenant_id: str | None) -> str | None:
        """The ``tenant_id`` filter a list or bulk call runs with."""
        org = confining_org()
        if org is None:
            return tenant_id
        if tenant_id is not None and tenant_id != org:
            raise JobsError(
                ErrorCode.X_JOB_TENANT_MISMATCH,
                "tenant_id= names another org than the ambient actor's: an actor sees only "
                "its own org's jobs (use cross_tenant(reason) for an actor holding "
                "tenancy:cross, or call outside acting_as() as an operator)",
            )
        return org

    async def _own(self, intro: JobIntrospection, job_id: str) -> JobView | None:
        """Under an org's actor, the job's view if it is that org's (else
        ``X_JOB_NOT_FOUND``, as for an unknown id); ``None`` when unconfined."""
        org = confining_org()
        if org is None:
            return None
        view = await intro.show(job_id)
        if view.tenant_id != org:
            raise JobsError(
                ErrorCode.X_JOB_NOT_FOUND,
                "no job has that id; list jobs with `trio-jobs list` to find it",
            )
        return view

    @staticmethod
    def _fleet_wide(what: str) -> None:
        """Refuse a call that spans every org under an org's actor."""
        if confining_org() is not None:
            raise JobsError(
                ErrorCode.X_FORBIDDEN,
                f"{what} spans every org, and the ambient actor acts for one: call it "
                "outside acting_as() (as an operator) or inside cross_tenant(reason) for an "
                "actor holding tenancy:cross",
            )

    async def _one(self, job_id: str) -> tuple[JobIntrospection, str]:
        """The operator surface, and the id ``job_id`` names: a whole id as given
        (made canonical), or the one job whose id starts with a prefix of at
        least 8 characters (``X_JOB_NOT_FOUND``, ``X_ID_AMBIGUOUS``); anything
        else is ``X_ID_INVALID``, before any I/O."""
        ref, is_prefix = job_ref(job_id)
        intro = await self._introspect()
        return intro, (await intro.resolve_id(ref) if is_prefix else ref)

    async def resolve_id(self, job_id: str) -> str:
        """The whole id ``job_id`` names: itself, made canonical, or the one job
        whose id starts with it (a prefix of at least 8 characters).

        >>> await jobs.resolve_id("6b63347c")
        '6b63347c-1d2c-4c3b-9a8e-7f6d5c4b3a21'

        ``X_JOB_NOT_FOUND``, ``X_ID_AMBIGUOUS`` and ``X_ID_INVALID`` as for
        :meth:`show` (a whole id is answered without asking the driver)."""
        return (await self._one(job_id))[1]

    async def show(self, job_id: str) -> JobView:
        """One job: state, attempts, keys, error, progress, result and its steps.

        Every call taking a ``job_id`` (``show``, ``requeue``, ``cancel``,
        ``remove``, ``promote``, ``resolve_step``) takes the whole id or a unique
        prefix of it of at least 8 characters, as ``trio-jobs dev`` prints it:

        >>> view = await jobs.show("6b63347c")

        A prefix no job's id starts with is ``X_JOB_NOT_FOUND``; one several
        start with is ``X_ID_AMBIGUOUS`` (``meta["matches"]`` names some); a
        value that is neither an id nor such a prefix is ``X_ID_INVALID``.
        Under an org's actor (:func:`acting_as`), another org's job is
        ``X_JOB_NOT_FOUND``."""
        from ._consumer import with_consumer

        intro, key = await self._one(job_id)
        own = await self._own(intro, key)
        return with_consumer(own if own is not None else await intro.show(key))

    async def list(
        self,
        *,
        queue: str | None = None,
        name: str | None = None,
        state: str | None = None,
        tenant_id: str | None = None,
        id_prefix: str | None = None,
        created_from: datetime | float | None = None,
        created_to: datetime | float | None = None,
        limit: int = 50,
        after: str | None = None,
        before: str | None = None,
    ) -> JobPage:
        """A keyset page of jobs, newest first (``limit`` at most ``MAX_JOB_PAGE``).

        Under an org's actor (:func:`acting_as`), only that org's jobs; a
        ``tenant_id`` naming another org is ``X_JOB_TENANT_MISMATCH``."""
        # Built (and so validated) before any driver is asked.
        page = ListFilter(
            queue=queue,
            name=name,
            state=state,
            tenant_id=self._confined_tenant(tenant_id),
            id_prefix=id_prefix,
            created_from=_epoch(created_from, what="created_from"),
            created_to=_epoch(created_to, what="created_to"),
            limit=limit,
            after=after,
            before=before,
        )
        return await (await self._introspect()).list(page)

    async def requeue(self, job_id: str, from_step: str | None = None) -> JobView:
        """Requeue a finished job; completed steps replay from storage."""
        if from_step is not None:
            _check_arg(from_step, "from_step")
        intro, key = await self._one(job_id)
        await self._own(intro, key)
        return await intro.requeue(key, from_step)

    retry = requeue

    async def cancel(self, job_id: str, reason: str | None = None) -> JobView:
        """Cancel a live job (a running one hears ``X_ABORTED`` at its next heartbeat)."""
        if reason is not None:
            _check_arg(reason, "the cancel reason")
        intro, key = await self._one(job_id)
        await self._own(intro, key)
        return await intro.cancel(key, reason)

    async def remove(self, job_id: str) -> None:
        """Delete a job that is not running, with its steps."""
        intro, key = await self._one(job_id)
        await self._own(intro, key)
        await intro.remove(key)

    async def remove_many(
        self,
        *,
        state: str,
        queue: str | None = None,
        name: str | None = None,
        tenant_id: str | None = None,
    ) -> BulkResult:
        rows = BulkFilter(state, queue, name, self._confined_tenant(tenant_id))
        return await (await self._introspect()).remove_many(rows)

    async def requeue_many(
        self,
        *,
        state: str,
        queue: str | None = None,
        name: str | None = None,
        tenant_id: str | None = None,
    ) -> BulkResult:
        rows = BulkFilter(state, queue, name, self._confined_tenant(tenant_id))
        return await (await self._introspect()).requeue_many(rows)

    async def promote(self, job_id: str) -> JobView:
        """Make a job waiting on its ``run_at`` due now."""
        intro, key = await self._one(job_id)
        await self._own(intro, key)
        return await intro.promote(key)

    async def promote_many(
        self,
        *,
        state: str,
        queue: str | None = None,
        name: str | None = None,
        tenant_id: str | None = None,
    ) -> BulkResult:
        rows = BulkFilter(state, queue, name, self._confined_tenant(tenant_id))
        return await (await self._introspect()).promote_many(rows)

    async def preview_many(
        self,
        action: BulkAction,
        *,
        state: str,
        queue: str | None = None,
        name: str | None = None,
        tenant_id: str | None = None,
        sample: int = 5,
    ) -> BulkPreview:
        """A dry run of ``remove_many``, ``requeue_many`` or ``promote_many``
        (``action``: ``"remove"``, ``"requeue"``, ``"promote"``) with this
        filter, writing nothing: ``.count``, how many jobs it would move if
        called until nothing remains, and ``.sample``, the first ``sample`` of
        them (0 to 50), oldest first. A filter the action refuses is refused
        alike. ``trio-jobs remove --state dead --dry-run`` prints it.

        >>> preview = await jobs.preview_many("remove", state="dead", queue="emails")
        >>> preview.count, [v.id for v in preview.sample]
        """
        if (
            isinstance(sample, bool)
            or not isinstance(sample, int)
            or not 0 <= sample <= MAX_PREVIEW_SAMPLE
        ):
            raise JobsError(
                ErrorCode.X_INVARIANT,
                f"sample is how many jobs to show: a whole number from 0 to {MAX_PREVIEW_SAMPLE}",
            )
        if action not in ("remove", "requeue", "promote"):
            raise JobsError(
                ErrorCode.X_INVARIANT, "action is one of 'remove', 'requeue' or 'promote'"
            )
        return await (await self._introspect()).preview_many(
            action, BulkFilter(state, queue, name, self._confined_tenant(tenant_id)), sample
        )

    async def resolve_step(self, job_id: str, step: str, *, ran: bool, output: Any = None) -> None:
        """Resolve a ``once`` step whose outcome is unknown: it ran (with ``output``)
        or it did not (it runs again on the next attempt)."""
        _check_arg(step, "the step name")
        form = payload_form(
            output, what="the step output", code=ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE
        )
        intro, key = await self._one(job_id)
        await self._own(intro, key)
        await intro.resolve_step(key, step, ran=ran, output=form)

    async def pause_queue(self, queue: str) -> None:
        """Stop every worker of the fleet claiming from ``queue`` (within one poll)."""
        _check_arg(queue, "the queue name")
        self._fleet_wide("pausing a queue")
        await (await self._introspect()).pause_queue(queue)

    async def resume_queue(self, queue: str) -> None:
        """Let the fleet claim from ``queue`` again."""
        _check_arg(queue, "the queue name")
        self._fleet_wide("resuming a queue")
        await (await self._introspect()).resume_queue(queue)

    async def paused_queues(self) -> builtins.list[str]:
        return await (await self._introspect()).paused_queues()

    async def workers(self) -> builtins.list[WorkerInfo]:
        """The live workers of the fleet, with the jobs each holds."""
        self._fleet_wide("workers()")
        return await (await self._introspect()).workers()

    async def counters(
        self, job: Job[Any, Any] | str | None = None, since: datetime | float = 0.0
    ) -> builtins.list[CounterRow]:
        """Settled-run history per time bucket, for one job name or all."""
        self._fleet_wide("counters()")
        name = job.name if isinstance(job, Job) else job
        if name is not None:
            _check_arg(name, "the job name")
        start = _epoch(since, what="since") or 0.0
        return await (await self._introspect()).counters(name, start)

    async def stats(self) -> builtins.list[QueueStats]:
        """Rows per state in each queue."""
        self._fleet_wide("stats()")
        return await (await self._resolved_driver()).stats()

    async def backfills(
        self, *, name: str | None = None, limit: int = 100
    ) -> builtins.list[BackfillRow]:
        """The backfill ledger: one :class:`BackfillRow` per ``backfill()`` pass
        (``name, job_id, pages, items, cursor, started_at, finished_at``), newest
        first; of backfill ``name`` only, when given; at most ``limit`` (1 to
        1,000). ``X_NOT_IMPLEMENTED`` on a driver that keeps no ledger."""
        self._fleet_wide("backfills()")
        from ._backfill import read_ledger

        return await read_ledger(self, name=name, limit=limit)

    # Scheduled tasks (``task()``): the logic lives in _scheduler.py.

    async def tasks(self) -> builtins.list[TaskView]:
        """Every scheduled task this facade declares or the store knows, by name:
        schedule, zone, paused, last and next fire (:class:`~trio_jobs.TaskView`)."""
        from ._scheduler import task_views

        return await task_views(self)

    async def pause_task(self, name: str) -> None:
        """Pause a task fleet-wide: no occurrence fires until it is resumed
        (``X_TASK_NOT_FOUND`` for a name no declaration or store knows)."""
        from ._scheduler import pause_task

        _check_arg(name, "the task name")
        self._fleet_wide("pausing a task")
        await pause_task(self, name)

    async def resume_task(self, name: str) -> None:
        """Resume a paused task; its ``catch_up`` decides what it missed."""
        from ._scheduler import resume_task

        _check_arg(name, "the task name")
        self._fleet_wide("resuming a task")
        await resume_task(self, name)


@contextlib.asynccontextmanager
async def open_jobs(
    driver: JobDriver | None = None,
    *,
    jobs: Sequence[Job[Any, Any]] = (),
    ids: IdSource | None = None,
    outbox: OutboxStore | None = None,
) -> AsyncIterator[Jobs]:
    """Open ``driver`` and install the ambient facade for the block.

    ``enqueue`` anywhere under it (request handler, job body, script, test)
    resolves this facade. The driver lives in a nursery the block opens (its
    ``open_in``): its background tasks are descendants of the task that entered
    ``open_jobs``, and leaving the block closes it (shielded, at most 10 s) and
    leaves none of them running. ``outbox`` (for a queue outside the app's
    database, see :mod:`trio_jobs.outbox`) is opened and closed with it, and
    ``jobs.transaction()`` stages into it.
    """
    if driver is None:
        if not _default_driver:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "open_jobs needs a driver: open_jobs(memory_driver(), jobs=[...]) or "
                "set_job_driver(driver) first",
            )
        driver = _default_driver[0]
    if not _is_driver(driver):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, "open_jobs takes a driver, e.g. memory_driver()"
        )
    facade = Jobs(driver, jobs, ids=ids, outbox=outbox)
    # What the block raised, re-raised past the nursery so that it is not
    # wrapped in an ExceptionGroup: nothing else in the nursery raises.
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        lifetimes = facade._lifetimes = DriverLifetimes(nursery)
        try:
            await lifetimes.open(driver)
            token = _ambient.facade_var.set(facade)
            try:
                if outbox is not None:
                    await outbox.open()
                yield facade
            finally:
                _ambient.facade_var.reset(token)
                try:
                    with trio.CancelScope(shield=True), trio.move_on_after(10):
                        # The driver it opened, and any set_job_driver() swapped in
                        # (or left pending, never opened: closed all the same).
                        closing: builtins.list[JobDriver] = []
                        for each in (driver, facade.driver, facade._pending_driver):
                            if each is not None and all(each is not seen for seen in closing):
                                closing.append(each)
                        for each in closing:
                            if lifetimes.holds(each):
                                await lifetimes.close(each)
                            else:
                                await each.close()
                        if outbox is not None:
                            await outbox.close()
                finally:
                    lifetimes.abandon()
        except BaseException as exc:
            failure = exc
    if failure is not None:
        try:
            raise failure
        finally:
            del failure


def _check_arg(value: object, what: str) -> None:
    """An operator call's text argument: a string every driver can store
    (``X_INVARIANT``, as the calls' other misuses)."""
    if not isinstance(value, str):
        raise JobsError(ErrorCode.X_INVARIANT, f"{what} must be a string")
    check_text(value, what=what, code=ErrorCode.X_INVARIANT)


def current_jobs() -> Jobs:
    """The ambient facade, or ``X_CONFIG_INVALID`` saying how to install one."""
    return current_facade()


async def publish_event(event: str, payload: Any) -> None:
    """Publish an event to the runs waiting for it; joins the ambient transaction."""
    facade = current_jobs()
    _ambient.check_not_aborted()
    if not isinstance(event, str) or not event or len(event) > 200:
        raise JobsError(
            ErrorCode.X_INVARIANT, "an event name is a non-empty string of at most 200 characters"
        )
    check_text(event, what="the event name", code=ErrorCode.X_INVARIANT)
    form = payload_form(
        payload, what=f"the payload of event {event!r}", code=ErrorCode.X_JOB_EVENT_INVALID
    )
    tx = _ambient.tx_var.get()
    if tx is not None and tx.jobs is facade:
        await tx.driver_tx.publish(event, form)
        return
    driver = await facade._resolved_driver()
    await driver.events.publish(event, form)


__all__ += ["enqueue_inputs", "MAX_BULK_ROWS"]
