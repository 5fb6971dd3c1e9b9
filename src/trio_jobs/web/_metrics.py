"""Prometheus metrics: the worker's (through :class:`PrometheusObserver`) and the
queues' (read from the facade at scrape time).

===============================  =========  ==========================================
metric                           type       what
===============================  =========  ==========================================
``queue_depth{queue}``           gauge      rows waiting to run: ready + delayed + suspended
``queue_demand{queue}``          gauge      slots the queue wants now: ready + running
                                            (what a worker autoscaler reads)
``queue_jobs{queue,state}``      gauge      rows per state
``queue_paused{queue}``          gauge      1 while the queue is paused
``jobs_total{queue,outcome}``    counter    attempts ended, by outcome (``done``, ``retried``,
                                            ``dead``, ``failed``, ``drained``, ``abandoned``)
``job_leases_lost_total{queue}`` counter    leases that lapsed under a running body: alert on
                                            any non-zero rate
``job_duration_seconds``         histogram  how long an attempt held its slot, by queue and job
``job_worker_in_flight``         gauge      slots in use, over this process's workers
``job_worker_capacity``          gauge      slots in all, over this process's workers
===============================  =========  ==========================================
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._facade import Jobs
from .._observe import WorkerObserver
from ..drivers._protocol import ALL_STATES, QueueStats
from ..errors import JobsError

__all__ = ["CONTENT_TYPE", "PrometheusObserver", "render_metrics"]

#: The content type of the text exposition format ``/metrics`` answers with.
CONTENT_TYPE = CONTENT_TYPE_LATEST

#: ``job_duration_seconds`` buckets: a 5 ms step to an hour-long backfill.
DURATION_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


class _WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs_total = Counter(
            "jobs_total",
            "Job attempts that ended, by queue and outcome.",
            ("queue", "outcome"),
            registry=registry,
        )
        self.leases_lost = Counter(
            "job_leases_lost_total",
            "Leases that lapsed while the body still ran (at-least-once becoming exactly-twice).",
            ("queue",),
            registry=registry,
        )
        self.duration = Histogram(
            "job_duration_seconds",
            "Seconds an attempt held its slot, claim to settle.",
            ("queue", "name"),
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "job_worker_in_flight", "Slots in use, over this process's workers.", registry=registry
        )
        self.capacity = Gauge(
            "job_worker_capacity", "Slots in all, over this process's workers.", registry=registry
        )


_lock = threading.Lock()
_by_registry: dict[int, tuple[CollectorRegistry, _WorkerMetrics]] = {}


def _metrics_for(registry: CollectorRegistry) -> _WorkerMetrics:
    # One set of metric objects per registry: two observers (two workers in one
    # process) share them instead of registering the same names twice.
    with _lock:
        found = _by_registry.get(id(registry))
        if found is None or found[0] is not registry:
            found = (registry, _WorkerMetrics(registry))
            _by_registry[id(registry)] = found
        return found[1]


class PrometheusObserver(WorkerObserver):
    """A :class:`~trio_jobs.WorkerObserver` that moves the worker metrics.

    >>> worker = Worker(jobs, observer=PrometheusObserver())

    The metrics live on ``registry`` (prometheus-client's default one unless
    given), which ``/metrics`` of :func:`trio_jobs.web.create_app` exposes; a
    worker process without the dashboard can expose them with
    ``prometheus_client.start_http_server(port)``. Several workers in one
    process (and several observers on one registry) add up.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else REGISTRY
        self._m = _metrics_for(self.registry)

    def worker_started(self, worker_id: str, capacity: int) -> None:
        self._m.capacity.inc(capacity)

    def worker_stopped(self, worker_id: str, capacity: int) -> None:
        self._m.capacity.dec(capacity)

    def slot_taken(self, queue: str, name: str) -> None:
        self._m.in_flight.inc()

    def slot_freed(self, queue: str, name: str, seconds: float | None) -> None:
        self._m.in_flight.dec()
        if seconds is not None:
            self._m.duration.labels(queue, name).observe(max(0.0, seconds))

    def attempt_ended(self, queue: str, name: str, outcome: str) -> None:
        self._m.jobs_total.labels(queue, outcome).inc()

    def lease_lost(self, queue: str, name: str) -> None:
        self._m.leases_lost.labels(queue).inc()


class _QueueSnapshot(Collector):
    """The queue gauges, from the last ``stats()`` read (read at each scrape)."""

    def __init__(self, stats: Sequence[QueueStats], paused: Iterable[str]) -> None:
        self.stats = list(stats)
        self.paused = set(paused)

    def collect(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily(
            "queue_depth", "Rows waiting to run: ready, delayed and suspended.", labels=["queue"]
        )
        demand = GaugeMetricFamily(
            "queue_demand",
            "Slots the queue wants now: ready plus running rows (what an autoscaler reads).",
            labels=["queue"],
        )
        rows = GaugeMetricFamily("queue_jobs", "Rows per state.", labels=["queue", "state"])
        paused = GaugeMetricFamily("queue_paused", "1 while the queue is paused.", labels=["queue"])
        names = sorted({s.queue for s in self.stats} | self.paused)
        by_queue = {s.queue: s for s in self.stats}
        for queue in names:
            stat = by_queue.get(queue, QueueStats(queue))
            depth.add_metric([queue], stat.depth)
            demand.add_metric([queue], stat.ready + stat.running)
            for state in ALL_STATES:
                rows.add_metric([queue, state], getattr(stat, state))
            paused.add_metric([queue], 1.0 if queue in self.paused else 0.0)
        return [depth, demand, rows, paused]


async def render_metrics(jobs: Jobs, registry: CollectorRegistry | None = None) -> bytes:
    """The text exposition of ``registry`` (the default one unless given) plus the
    queue gauges, read from ``jobs`` now."""
    stats = await jobs.stats()
    try:
        paused = await jobs.paused_queues()
    except JobsError:  # a driver without the operator surface: no pause to report
        paused = []
    queues = CollectorRegistry(auto_describe=False)
    queues.register(_QueueSnapshot(stats, paused))
    own = generate_latest(registry if registry is not None else REGISTRY)
    return own + generate_latest(queues)
