"""OpenTelemetry spans for jobs, a no-op without ``opentelemetry-api``.

* At enqueue, the caller's current span context is written into the row as a
  W3C ``traceparent`` (``EnqueueRequest.trace_context``); baggage is not
  carried (it is app data).
* Each attempt is one ``CONSUMER`` span, ``job <name>``, started by the worker
  with the row's trace context as a link (the default) or as its parent
  (``trio_jobs.tracing.configure(propagation="child")``).
* Each executed ``step.run`` is a child span, ``step <name>``.

Spans carry ids, names, queues, attempts, outcomes and error codes; never a
payload value, an idempotency or concurrency key, a tenant, or an exception's
message (any of which can quote app data).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

import trio

if TYPE_CHECKING:
    from .drivers._protocol import ClaimedJob

__all__ = ["attempt_span", "configure", "end_attempt", "inject", "step_span"]

try:  # pragma: no branch - both arms are exercised by the test matrix
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
    ENABLED = True
except ImportError:  # the `otel` extra is not installed: every call is a no-op
    _PROPAGATOR = None
    ENABLED = False

Propagation = Literal["link", "child"]

_settings: dict[str, Any] = {"propagation": "link", "provider": None}

INSTRUMENTATION = "trio_jobs"
#: Outcomes that mark an attempt span as an error.
_ERROR_OUTCOMES = frozenset({"retried", "dead", "failed", "lease-lost", "abandoned", "faulted"})


def configure(*, propagation: Propagation, tracer_provider: Any) -> None:
    """Set how attempts relate to their enqueuer, and which provider makes spans."""
    _settings["propagation"] = propagation
    _settings["provider"] = tracer_provider


def recording() -> bool:
    """Whether spans go anywhere: a provider was configured here, or an SDK was
    installed globally. Without one, the API's proxy makes no-op spans, and
    skipping them saves ~12% of a no-op job's CPU (benchmarks/README.md). The
    worker asks once per claim (an ``os.environ`` lookup inside OpenTelemetry),
    and the attempts it claimed and their step spans follow that answer."""
    if not ENABLED:
        return False
    if _settings["provider"] is not None:
        return True
    return not isinstance(_otel_trace.get_tracer_provider(), _otel_trace.ProxyTracerProvider)


def _tracer() -> Any:
    provider = _settings["provider"]
    if provider is not None:
        return provider.get_tracer(INSTRUMENTATION)
    return _otel_trace.get_tracer(INSTRUMENTATION)


def inject() -> dict[str, str] | None:
    """The current span's W3C trace context (``traceparent``/``tracestate``), or
    ``None`` when there is no sampled-or-not valid span (or no OpenTelemetry)."""
    if not ENABLED:
        return None
    span = _otel_trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


def _extract(trace_context: Mapping[str, str] | None) -> Any:
    """The span context stored on a row, or ``None``."""
    if not trace_context:
        return None
    try:
        ctx = _PROPAGATOR.extract(dict(trace_context))
    except Exception:  # a malformed stored header is ignored, never raised
        return None
    found = _otel_trace.get_current_span(ctx).get_span_context()
    return ctx if found.is_valid else None


def attempt_span(claimed: ClaimedJob, worker_id: str, traced: bool) -> AbstractContextManager[Any]:
    """One span for one attempt, current for the body (so step spans nest in it);
    a no-op context (``None``) when nothing records spans (``traced``: what
    :func:`recording` answered for this attempt)."""
    if not traced:
        return _NO_SPAN
    return _attempt_span(claimed, worker_id)


#: Entered per attempt and per step when tracing is off: reusable, no generator.
_NO_SPAN: AbstractContextManager[Any] = contextlib.nullcontext()


@contextlib.contextmanager
def _attempt_span(claimed: ClaimedJob, worker_id: str) -> Iterator[Any]:
    stored = _extract(claimed.trace_context)
    links = []
    # An empty context, not the current one: the worker task's own ambient span
    # (whoever called worker.run) is not this job's parent.
    parent = _otel_context.Context()
    if stored is not None:
        if _settings["propagation"] == "child":
            parent = stored
        else:
            links.append(_otel_trace.Link(_otel_trace.get_current_span(stored).get_span_context()))
    attributes = {
        "messaging.system": "trio_jobs",
        "messaging.operation.type": "process",
        "messaging.destination.name": claimed.queue,
        "messaging.message.id": claimed.id,
        "trio_jobs.job.id": claimed.id,
        "trio_jobs.job.run_id": claimed.run_id,
        "trio_jobs.job.name": claimed.name,
        "trio_jobs.job.queue": claimed.queue,
        "trio_jobs.job.attempt": claimed.attempt,
        "trio_jobs.job.max_attempts": claimed.max_attempts,
        "trio_jobs.worker.id": worker_id,
    }
    with _tracer().start_as_current_span(
        f"job {claimed.name}",
        context=parent,
        kind=_otel_trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_attempt(span: Any, outcome: str, code: str | None) -> None:
    """Stamp how the attempt ended on its span (before the span closes)."""
    if span is None:
        return
    span.set_attribute("trio_jobs.outcome", outcome)
    if code:
        span.set_attribute("trio_jobs.error.code", code)
    if outcome in _ERROR_OUTCOMES:
        span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, code or outcome))


def step_span(name: str, execution: int, once: bool, traced: bool) -> AbstractContextManager[Any]:
    """A child span of the current attempt around one executed ``step.run``;
    ``traced`` is the attempt's answer from :func:`recording`.

    An exception is stamped with its type and ``X_*`` code only (its message
    may quote app data) and re-raised unchanged."""
    if not traced:
        return _NO_SPAN
    return _step_span(name, execution, once)


@contextlib.contextmanager
def _step_span(name: str, execution: int, once: bool) -> Iterator[None]:
    with _tracer().start_as_current_span(
        f"step {name}",
        attributes={
            "trio_jobs.step.name": name,
            "trio_jobs.step.execution": execution,
            "trio_jobs.step.once": once,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, trio.Cancelled):
                span.set_attribute("trio_jobs.step.cancelled", True)
                raise
            code = getattr(exc, "code", None)
            span.set_attribute("error.type", type(exc).__name__)
            if isinstance(code, str):
                span.set_attribute("trio_jobs.error.code", code)
            span.set_status(
                _otel_trace.Status(
                    _otel_trace.StatusCode.ERROR,
                    code if isinstance(code, str) else type(exc).__name__,
                )
            )
            raise
