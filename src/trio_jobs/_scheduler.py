"""The scheduler: fires the occurrences of the tasks a worker serves.

Every :class:`~trio_jobs.Worker` serving a task's queue runs one (a task of the
worker's service nursery). One process of the fleet leads each task at a time,
through a lease in the driver's task store (:class:`~trio_jobs.drivers.TaskStore`):
every scheduler takes or renews the leases of all its tasks in one round trip
every :data:`RENEW_EVERY` seconds, well inside the :data:`LEASE_TTL`; a
follower also tries again the instant the lease it saw lapses, so it takes over
within one ttl of the leader's death. While it leads, a scheduler holds each
task's watermark in memory and sleeps to the next occurrence or renewal,
whichever is first: an idle scheduler issues no statement in between. At an
occurrence it decides what to fire by the task's ``catch_up`` (``_task.decide``)
and fires every due task in one round trip, the rows and the watermark together
(:meth:`TaskStore.fire`, fenced on the lease and the watermark it holds).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from . import _ambient
from ._task import Schedule, Task, TaskView, decide, tasks_of
from .drivers._tasks import TaskFire, TaskLead, TaskSpec, TaskStore
from .errors import ErrorCode, JobsError
from .logging import emit

if TYPE_CHECKING:
    from ._facade import Jobs

__all__ = [
    "LEASE_TTL",
    "RENEW_EVERY",
    "Scheduler",
    "fire_due",
    "pause_task",
    "resume_task",
    "scheduler_for",
    "task_views",
]

log = logging.getLogger("trio_jobs")

#: How long a leader's lease on a task holds without a renewal (store clock).
LEASE_TTL = 30.0
#: How often a scheduler renews (or tries to take) its tasks' leases.
RENEW_EVERY = 10.0
#: After a failed store call, the first wait before trying again (doubling to RENEW_EVERY).
RETRY_FIRST = 1.0
#: The budget of the shielded release of the leases when a scheduler stops.
RELEASE_BUDGET = 5.0
#: The least time between two attempts to take over a lapsed lease.
TAKEOVER_SPACING = 1.0
#: After a fire that did not land, the pause before the store is read again.
MISSED_FIRE_PAUSE = 0.1


def spec_of(handle: Task) -> TaskSpec:
    return TaskSpec(
        name=handle.name,
        schedule=handle.schedule.text,
        tz=handle.tz,
        catch_up=handle.catch_up,
        queue=handle.queue,
    )


@attrs.define
class _State:
    handle: Task
    led: bool = False
    paused: bool = False
    watermark: float = -math.inf
    #: (Trio clock) until when this process's lease surely holds.
    lease_until: float = -math.inf
    #: (store clock) when another holder's lease lapses, when it is not ours.
    other_until: float | None = None


def fires_for(states: Sequence[_State], now: float, ids: Any) -> list[TaskFire]:
    """The fires due at ``now`` (driver clock) for the led, unpaused ``states``."""
    fires = []
    for st in states:
        handle = st.handle
        fire, through, capped = decide(handle.schedule, handle.catch_up, st.watermark, now)
        if through is None:
            continue
        if capped:
            emit(
                log,
                logging.WARNING,
                "jobs.task.catch-up-capped",
                task=handle.name,
                fired=len(fire),
                hint="more than 1,000 occurrences fell due; the oldest were skipped",
            )
        fires.append(
            TaskFire(
                name=handle.name,
                watermark=st.watermark,
                through=through,
                requests=[handle.occurrence_request(at, ids) for at in fire],
                last_fire=fire[-1] if fire else None,
            )
        )
    return fires


class Scheduler:
    """One process's scheduler for ``handles``, leading as ``leader``."""

    def __init__(
        self,
        jobs: Jobs,
        handles: Sequence[Task],
        leader: str,
        *,
        ttl: float = LEASE_TTL,
        renew: float = RENEW_EVERY,
    ) -> None:
        self.jobs = jobs
        self.leader = leader
        self.ttl = ttl
        self.renew = renew
        self._states = {h.name: _State(h) for h in handles}
        self._specs = [spec_of(h) for h in handles]
        self._next_lead = -math.inf
        self._last_lead = -math.inf
        #: After a failed store call, nothing is tried before this (Trio clock).
        self._hold_until = -math.inf
        self._failures = 0

    @property
    def store(self) -> TaskStore | None:
        return self.jobs.driver.tasks

    def led(self) -> list[str]:
        return sorted(name for name, st in self._states.items() if st.led)

    async def run(self) -> None:
        """Lead and fire until cancelled; then give up the leases held."""
        _ambient.role_var.set("scheduler")
        if self.store is None or not self._states:
            return
        try:
            while True:
                now_t = trio.current_time()
                if now_t >= self._hold_until:
                    try:
                        if now_t >= self._next_lead or self._takeover_due(now_t):
                            await self.lead()
                        await self.fire()
                        self._failures = 0
                    except JobsError as exc:
                        self._failed(exc)
                await trio.sleep_until(self._next_wake())
        finally:
            await self._release()

    def _failed(self, exc: JobsError) -> None:
        emit(log, logging.WARNING, "jobs.task.store-failed", code=exc.code, leader=self.leader)
        self._failures += 1
        wait = min(self.renew, RETRY_FIRST * 2 ** (self._failures - 1))
        self._hold_until = trio.current_time() + wait
        self._next_lead = min(self._next_lead, self._hold_until)

    def _takeover_due(self, now_t: float) -> bool:
        """Whether a lease another process holds has lapsed by now (tried at most
        once a second: a clock ahead of the store's sees it lapse early)."""
        if now_t < self._last_lead + TAKEOVER_SPACING:
            return False
        now = self.jobs.driver.now()
        return any(
            not st.led and st.other_until is not None and st.other_until <= now
            for st in self._states.values()
        )

    async def lead(self) -> None:
        """Take or renew every task's lease (one round trip)."""
        store = self.store
        assert store is not None
        started = trio.current_time()
        self._next_lead = started + self.renew
        self._last_lead = started
        leads = await store.lead(self.leader, self._specs, self.ttl)
        for lead in leads:
            self._took(lead, started)

    def _took(self, lead: TaskLead, started: float) -> None:
        st = self._states.get(lead.name)
        if st is None:
            return
        mine = lead.leader == self.leader
        if mine and not st.led:
            emit(log, logging.INFO, "jobs.task.leading", task=lead.name, leader=self.leader)
        st.led = mine
        st.paused = lead.paused
        if mine:
            st.watermark = lead.watermark
            st.lease_until = started + self.ttl
            st.other_until = None
        else:
            st.lease_until = -math.inf
            st.other_until = lead.lease_expires_at

    def _firing(self) -> list[_State]:
        now = trio.current_time()
        return [
            st for st in self._states.values() if st.led and not st.paused and st.lease_until > now
        ]

    async def fire(self) -> None:
        """Fire what is due now for the tasks this process leads (one round trip)."""
        states = self._firing()
        if not states:
            return
        driver = self.jobs.driver
        fires = fires_for(states, driver.now(), self.jobs.ids)
        if not fires:
            return
        landed = set(await self._send(fires))
        for f in fires:
            st = self._states[f.name]
            if f.name in landed:
                st.watermark = f.through
                if f.requests:
                    emit(
                        log,
                        logging.INFO,
                        "jobs.task.fired",
                        task=f.name,
                        occurrences=len(f.requests),
                        leader=self.leader,
                    )
            else:
                # Paused, or the lease or the watermark moved: read the store again
                # (after a beat, so a store that keeps refusing is not hammered).
                self._hold_until = trio.current_time() + MISSED_FIRE_PAUSE
                self._next_lead = self._hold_until

    async def _send(self, fires: list[TaskFire]) -> list[str]:
        """The fire: the rows and the watermarks in one call."""
        store = self.store
        assert store is not None
        return await store.fire(self.leader, fires)

    def _next_wake(self) -> float:
        """The next instant (Trio clock) anything is due: a renewal, a task's next
        occurrence, or the lapse of a lease another process holds."""
        now_t = trio.current_time()
        now = self.jobs.driver.now()
        wake = self._next_lead
        for st in self._firing():
            at = st.handle.schedule.next_after(st.watermark)
            wake = min(wake, now_t + max(0.0, at - now))
        takeover = self._last_lead + TAKEOVER_SPACING
        for st in self._states.values():
            if not st.led and st.other_until is not None:
                wake = min(wake, max(takeover, now_t + max(0.0, st.other_until - now) + 0.001))
        return max(wake, self._hold_until)

    async def _release(self) -> None:
        names = self.led()
        store = self.store
        if not names or store is None or self.jobs.driver.closed:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_BUDGET):
            try:
                await store.release(self.leader, names)
            except Exception:  # the leases lapse by themselves
                pass
        for name in names:
            self._states[name].led = False


async def fire_due(jobs: Jobs, handles: Sequence[Task], leader: str) -> int:
    """Lead ``handles`` and fire every occurrence due now by their ``catch_up``
    (the harness's ``drain()``): answers how many occurrences fired."""
    store = jobs.driver.tasks
    if store is None or not handles:
        return 0
    scheduler = Scheduler(jobs, handles, leader)
    await scheduler.lead()
    states = scheduler._firing()
    fires = fires_for(states, jobs.driver.now(), jobs.ids)
    if not fires:
        return 0
    landed = set(await store.fire(leader, fires))
    return sum(len(f.requests) for f in fires if f.name in landed)


def scheduler_for(jobs: Jobs, queues: Sequence[str], leader: str) -> Scheduler | None:
    """The scheduler a worker serving ``queues`` runs: one for the tasks of those
    queues (``None`` when it serves none). A driver with no task store cannot
    fire them: ``X_CONFIG_INVALID``, before the worker starts."""
    handles = [h for h in tasks_of(list(jobs.handles.values())) if h.queue in queues]
    if not handles:
        return None
    if jobs.driver.tasks is None:
        names = ", ".join(h.name for h in handles)
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"the {jobs.driver.name} driver has no task store, so it cannot run the "
            f"scheduler for these tasks: {names}",
        )
    return Scheduler(jobs, handles, leader)


# --------------------------------------------------------------------------- operating


async def _store(jobs: Jobs) -> TaskStore:
    driver = await jobs._resolved_driver()
    store = driver.tasks
    if store is None:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED, f"the {driver.name} driver has no scheduled tasks"
        )
    return store


async def task_views(jobs: Jobs) -> list[TaskView]:
    """Every task the facade declares or the store knows, by name."""
    store = await _store(jobs)
    rows = {r.name: r for r in await store.rows()}
    paused = set(await store.paused())
    handles = {h.name: h for h in tasks_of(list(jobs.handles.values()))}
    now = jobs.driver.now()
    views = []
    for name in sorted(set(rows) | set(handles)):
        handle = handles.get(name)
        row = rows.get(name)
        if handle is not None:
            schedule = handle.schedule
        else:
            assert row is not None
            schedule = Schedule.parse(row.schedule, row.tz)
        stopped = name in paused
        last = row.last_fire if row is not None else None
        views.append(
            TaskView(
                name=name,
                schedule=schedule.text,
                tz=schedule.tz_name,
                paused=stopped,
                last_fire=schedule.local(last) if last is not None else None,
                next_fire=None if stopped else schedule.local(schedule.next_after(now)),
            )
        )
    return views


async def _known(jobs: Jobs, store: TaskStore, name: str) -> None:
    if any(h.name == name for h in tasks_of(list(jobs.handles.values()))):
        return
    if any(r.name == name for r in await store.rows()):
        return
    raise JobsError(
        ErrorCode.X_TASK_NOT_FOUND,
        "no task has that name; `trio-jobs tasks` (or jobs.tasks()) lists them",
        meta={"task": name},
    )


async def pause_task(jobs: Jobs, name: str) -> None:
    store = await _store(jobs)
    await _known(jobs, store, name)
    await store.pause(name)


async def resume_task(jobs: Jobs, name: str) -> None:
    store = await _store(jobs)
    await _known(jobs, store, name)
    await store.resume(name)
