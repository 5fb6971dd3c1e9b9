"""OpenTelemetry tracing for jobs (the ``otel`` extra: ``pip install 'trio-jobs[otel]'``).

Nothing to switch on: with ``opentelemetry-api`` installed, every enqueue
records the caller's span context on the row (W3C ``traceparent``), the
worker opens one ``job <name>`` span per attempt and one ``step <name>`` child
span per executed ``step.run``. Without an SDK (or without the package) every
call is a no-op. Spans never carry payload values, keys, tenants or exception
messages: ids, names, the queue, the attempt, the outcome and ``X_*`` codes.

>>> from opentelemetry.sdk.trace import TracerProvider
>>> trio_jobs.tracing.configure(propagation="child", tracer_provider=TracerProvider())
"""

from __future__ import annotations

from typing import Any

from . import _tracing
from ._tracing import Propagation

__all__ = ["configure", "enabled"]


def configure(*, propagation: Propagation = "link", tracer_provider: Any = None) -> None:
    """Choose how an attempt's span relates to the span that enqueued the job.

    ``propagation="link"`` (the default): each attempt starts a new trace whose
    root span carries a *link* to the enqueuer's span — a job that retries for
    three days does not stretch the request's trace over three days.
    ``propagation="child"``: each attempt is a child of the enqueuer's span, in
    its trace. ``tracer_provider`` replaces the global provider for trio-jobs'
    spans (``None``: OpenTelemetry's global one). Each call sets both.
    """
    if propagation not in ("link", "child"):
        from .errors import ErrorCode, JobsError

        raise JobsError(ErrorCode.X_CONFIG_INVALID, 'propagation is "link" or "child"')
    _tracing.configure(propagation=propagation, tracer_provider=tracer_provider)


def enabled() -> bool:
    """Whether ``opentelemetry-api`` is importable (else tracing is a no-op)."""
    return _tracing.ENABLED
