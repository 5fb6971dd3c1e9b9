"""The worker's metrics seam: a small observer the :class:`~trio_jobs.Worker` calls.

The worker knows nothing about Prometheus (or any metrics library): it calls
an observer at the few moments a metric moves — it starts and stops, a slot is
taken and freed, an attempt ends, a lease is lost. The default observer does
nothing; :class:`trio_jobs.web.PrometheusObserver` turns the calls into the
spec's metrics. Every method is synchronous and must be cheap: it runs on the
worker's own task, between a settle and the next claim.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .logging import emit

__all__ = ["NOOP_OBSERVER", "OUTCOMES", "CompositeObserver", "WorkerObserver", "guarded"]

log = logging.getLogger("trio_jobs")

#: The values of ``outcome`` that :meth:`WorkerObserver.attempt_ended` reports
#: (the names of :class:`~trio_jobs.WorkerStats`' counters): ``done``,
#: ``retried``, ``dead`` (dead-lettered), ``failed`` (dropped or refused),
#: ``drained`` (interrupted by a drain, attempt uncounted), ``abandoned``
#: (a body that ignored its abort past the drain deadline) and ``faulted`` (the
#: library's own statements met an infrastructure fault, attempt uncounted).
OUTCOMES: tuple[str, ...] = (
    "done",
    "retried",
    "dead",
    "failed",
    "drained",
    "abandoned",
    "faulted",
)


class WorkerObserver:
    """What a worker reports as it runs; every method is a no-op here.

    Subclass it and override what you need, then hand an instance to
    ``Worker(jobs, observer=...)``. Labels are bounded: a queue name, a job
    name, an outcome from :data:`OUTCOMES`. No id, input or payload value
    is ever passed.

    >>> class Count(WorkerObserver):
    ...     def __init__(self):
    ...         self.done = 0
    ...     def attempt_ended(self, queue, name, outcome):
    ...         self.done += outcome == "done"
    """

    def worker_started(self, worker_id: str, capacity: int) -> None:
        """The worker began claiming with ``capacity`` slots in all."""

    def worker_stopped(self, worker_id: str, capacity: int) -> None:
        """The worker's ``run()`` is returning; its ``capacity`` is gone."""

    def slot_taken(self, queue: str, name: str) -> None:
        """A claimed job of ``queue`` took a slot (in-flight went up by one)."""

    def slot_freed(self, queue: str, name: str, seconds: float | None) -> None:
        """A slot was freed. ``seconds`` is how long the attempt held it, or
        ``None`` when the body never ran (refused, deferred, unknown job)."""

    def attempt_ended(self, queue: str, name: str, outcome: str) -> None:
        """An attempt ended with ``outcome`` (one of :data:`OUTCOMES`)."""

    def lease_lost(self, queue: str, name: str) -> None:
        """A held job's lease lapsed while its body ran (``jobs.lease.lost``)."""


#: The observer a worker uses when it is given none: it does nothing.
NOOP_OBSERVER = WorkerObserver()


class CompositeObserver(WorkerObserver):
    """Fan every call out to several observers, in order."""

    def __init__(self, observers: Sequence[WorkerObserver]) -> None:
        self.observers = tuple(observers)

    def worker_started(self, worker_id: str, capacity: int) -> None:
        for each in self.observers:
            each.worker_started(worker_id, capacity)

    def worker_stopped(self, worker_id: str, capacity: int) -> None:
        for each in self.observers:
            each.worker_stopped(worker_id, capacity)

    def slot_taken(self, queue: str, name: str) -> None:
        for each in self.observers:
            each.slot_taken(queue, name)

    def slot_freed(self, queue: str, name: str, seconds: float | None) -> None:
        for each in self.observers:
            each.slot_freed(queue, name, seconds)

    def attempt_ended(self, queue: str, name: str, outcome: str) -> None:
        for each in self.observers:
            each.attempt_ended(queue, name, outcome)

    def lease_lost(self, queue: str, name: str) -> None:
        for each in self.observers:
            each.lease_lost(queue, name)


class _Guarded(WorkerObserver):
    """An observer whose failures are logged once per method, never raised into
    the worker: a broken metrics sink must not fail a job."""

    def __init__(self, inner: WorkerObserver) -> None:
        self.inner = inner
        self._reported: set[str] = set()

    def _call(self, method: str, *args: Any) -> None:
        try:
            getattr(self.inner, method)(*args)
        except Exception as exc:
            if method not in self._reported:
                self._reported.add(method)
                emit(
                    log,
                    logging.WARNING,
                    "jobs.observer.failed",
                    method=method,
                    cause=type(exc).__name__,
                )

    def worker_started(self, worker_id: str, capacity: int) -> None:
        self._call("worker_started", worker_id, capacity)

    def worker_stopped(self, worker_id: str, capacity: int) -> None:
        self._call("worker_stopped", worker_id, capacity)

    def slot_taken(self, queue: str, name: str) -> None:
        self._call("slot_taken", queue, name)

    def slot_freed(self, queue: str, name: str, seconds: float | None) -> None:
        self._call("slot_freed", queue, name, seconds)

    def attempt_ended(self, queue: str, name: str, outcome: str) -> None:
        self._call("attempt_ended", queue, name, outcome)

    def lease_lost(self, queue: str, name: str) -> None:
        self._call("lease_lost", queue, name)


def guarded(observer: WorkerObserver | None) -> WorkerObserver:
    """The observer a worker calls: ``observer`` behind a guard, or the no-op."""
    if observer is None or observer is NOOP_OBSERVER:
        return NOOP_OBSERVER
    if not isinstance(observer, WorkerObserver):
        from .errors import ErrorCode, JobsError

        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "observer= takes a trio_jobs.WorkerObserver (subclass it, or use "
            "trio_jobs.web.PrometheusObserver())",
        )
    return _Guarded(observer)
