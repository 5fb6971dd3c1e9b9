"""The public surface (STYLE.md principle 7): the names each public package
exports are pinned here, every exported name resolves and is documented, and
``__all__`` is kept alphabetised within its groups.

Changing a list below is changing the public API: say so in CHANGELOG.md."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import trio_jobs
import trio_jobs.drivers
import trio_jobs.logging
import trio_jobs.outbox
import trio_jobs.testing
import trio_jobs.tracing

PACKAGES = [
    trio_jobs,
    trio_jobs.drivers,
    trio_jobs.outbox,
    trio_jobs.testing,
    trio_jobs.logging,
    trio_jobs.tracing,
]
try:  # the `web` extra (the test extra installs it)
    import trio_jobs.web
except ImportError:  # pragma: no cover
    pass
else:
    PACKAGES.append(trio_jobs.web)
SRC = Path(trio_jobs.__file__).resolve().parent

#: What an app imports: declaring, enqueueing, running, operating (the records
#: the operator surface answers that PYTHON-API.md names), and the drivers'
#: constructors. Seam records and bounds only a driver author needs are in
#: ``trio_jobs.drivers``.
TOP_LEVEL = [
    "Actor",
    "Anonymize",
    "Answer",
    "BackfillRow",
    "Bucket",
    "DEFAULT_WEBHOOK_BODY_LIMIT",
    "Concurrency",
    "ConsumerBatch",
    "Endpoint",
    "Enqueued",
    "ErrorCode",
    "ErrorSink",
    "Inbound",
    "Job",
    "JobContext",
    "JobPage",
    "JobView",
    "Jobs",
    "JobsError",
    "MAX_BULK_ROWS",
    "MAX_ENQUEUE_BATCH",
    "MAX_JOB_PAGE",
    "Occurrence",
    "Outcome",
    "PurgeResult",
    "RateLimiter",
    "ReceivedWebhook",
    "Retain",
    "Retention",
    "Retry",
    "Settled",
    "Signal",
    "StepView",
    "Steps",
    "Subject",
    "TaskView",
    "Transaction",
    "Verified",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpointState",
    "WebhookEvent",
    "WebhookLedger",
    "Worker",
    "WorkerObserver",
    "WorkerStats",
    "acting_as",
    "backfill",
    "consumer",
    "cross_tenant",
    "current_jobs",
    "define_subject",
    "export_rows",
    "import_rows",
    "job",
    "memory_driver",
    "memory_webhook_ledger",
    "next_fire",
    "open_jobs",
    "outside_call",
    "postgres_driver",
    "postgres_webhook_ledger",
    "publish_event",
    "purge_expired",
    "rate_limiter",
    "redis_driver",
    "refresh_view",
    "register_error_retry",
    "rollup",
    "run_to_completion",
    "set_job_driver",
    "subject_erase",
    "subject_export",
    "subject_proof",
    "task",
    "verify_body_hmac",
    "verify_webhook_signature",
    "webhook",
    "webhook_receiver",
]

#: The driver seam: the protocol, the records crossing it, its bounds, the drivers.
DRIVERS = [
    "ALL_STATES",
    "AckBatches",
    "AckOptions",
    "BackfillLedger",
    "BackfillPage",
    "BackfillRow",
    "BulkFilter",
    "BulkResult",
    "ClaimOptions",
    "ClaimResult",
    "ClaimedJob",
    "CounterRow",
    "DriverTransaction",
    "ENQUEUE_CHUNK",
    "EnqueueRequest",
    "EnqueueResult",
    "EventRecord",
    "EventStore",
    "Exhausted",
    "Fence",
    "HeartbeatRequest",
    "HeartbeatStatus",
    "JobDriver",
    "JobIntrospection",
    "JobPage",
    "JobState",
    "JobView",
    "LIVE_STATES",
    "LeaseGrant",
    "LeaseStore",
    "ListFilter",
    "MAX_BACKFILL_ROWS",
    "MAX_BULK_ROWS",
    "MAX_ENQUEUE_BATCH",
    "MAX_JOB_PAGE",
    "MemoryDriver",
    "NackOptions",
    "PROMOTABLE_STATES",
    "Progress",
    "QueueStats",
    "RateGrant",
    "RateLimitStore",
    "StepRecord",
    "StepStatus",
    "StepStore",
    "StepView",
    "TERMINAL_STATES",
    "TaskFire",
    "TaskLead",
    "TaskRow",
    "TaskSpec",
    "TaskStore",
    "UNWIND_MARGIN",
    "WakeSource",
    "WorkerInfo",
    "memory_driver",
    "postgres_driver",
    "redis_driver",
]

TESTING = [
    "CheckFailure",
    "CheckReport",
    "CrashReport",
    "Faults",
    "Harness",
    "HarnessClock",
    "JobCheck",
    "SimulationResult",
    "StepTrace",
    "Trace",
    "World",
    "check_jobs",
    "crash_proof",
    "open_harness",
    "simulate_jobs",
]

WEB = [
    "Auth",
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "DEFAULT_PREFIX",
    "Dashboard",
    "PrometheusObserver",
    "create_app",
    "mount_receivers",
    "render_metrics",
    "serve",
    "standalone_app",
]

PINNED = {
    "trio_jobs": TOP_LEVEL,
    "trio_jobs.drivers": DRIVERS,
    "trio_jobs.testing": TESTING,
    "trio_jobs.web": WEB,
}


@pytest.mark.parametrize("module", sorted(PINNED))
def test_the_public_names_are_pinned(module: str) -> None:
    if module == "trio_jobs.web":
        pytest.importorskip("starlette", reason="trio_jobs.web needs the `web` extra")
    pkg = importlib.import_module(module)
    assert sorted(pkg.__all__) == sorted(PINNED[module])
    assert len(set(pkg.__all__)) == len(pkg.__all__), f"{module}.__all__ names one twice"


#: Names that moved to trio_jobs.drivers (issue 15): not importable from the top level.
MOVED_TO_DRIVERS = [
    "BulkResult",
    "CounterRow",
    "JobDriver",
    "LIVE_STATES",
    "PROMOTABLE_STATES",
    "QueueStats",
    "TERMINAL_STATES",
    "UNWIND_MARGIN",
    "WorkerInfo",
]


@pytest.mark.parametrize("name", MOVED_TO_DRIVERS)
def test_seam_records_live_in_drivers_not_at_the_top_level(name: str) -> None:
    assert not hasattr(trio_jobs, name), (
        f"trio_jobs.{name}: a seam name, export it from trio_jobs.drivers"
    )
    assert name in trio_jobs.drivers.__all__


def test_the_drivers_constructors_are_the_same_objects_at_both_levels() -> None:
    for name in ("memory_driver", "postgres_driver", "redis_driver"):
        assert getattr(trio_jobs, name) is getattr(trio_jobs.drivers, name)


#: Exported names that may lack a docstring or ``#:`` doc comment (none today).
UNDOCUMENTED: set[str] = set()


def _exports() -> list[tuple[ModuleType, str]]:
    return [(pkg, name) for pkg in PACKAGES for name in pkg.__all__]


def _param(pkg: ModuleType, name: str) -> Any:
    full = f"{pkg.__name__}.{name}"
    marks = []
    if full in UNDOCUMENTED:
        marks.append(pytest.mark.xfail(strict=True, reason=f"BUG: {full} has no docstring"))
    return pytest.param(pkg, name, id=full, marks=marks)


def _is_data(obj: object) -> bool:
    if getattr(obj, "__module__", None) == "typing":  # a type alias (Literal[...])
        return True
    return not (inspect.isclass(obj) or callable(obj) or inspect.ismodule(obj))


def _own_docstring(obj: object) -> str | None:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")  # not one inherited from a base
    else:
        doc = getattr(obj, "__doc__", None)
    return doc if isinstance(doc, str) else None


def _doc_comment(name: str) -> str | None:
    """The ``#:`` comment above (or the string literal below) ``NAME = ...`` in src/."""
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        lines = source.splitlines()
        body = tree.body
        for index, node in enumerate(body):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                continue
            comments = []
            line = node.lineno - 2
            while line >= 0 and lines[line].lstrip().startswith("#:"):
                comments.insert(0, lines[line].lstrip()[2:].strip())
                line -= 1
            if comments:
                return " ".join(comments)
            following = body[index + 1] if index + 1 < len(body) else None
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                return following.value.value
    return None


@pytest.mark.parametrize(("pkg", "name"), [_param(p, n) for p, n in _exports()])
def test_every_exported_name_resolves_and_is_documented(pkg: ModuleType, name: str) -> None:
    assert hasattr(pkg, name), f"{pkg.__name__}.__all__ names {name!r}, which does not resolve"
    obj = getattr(pkg, name)
    if _is_data(obj):
        doc = _doc_comment(name)
        assert doc, f"{name}: document the constant with a '#:' comment above it"
    else:
        doc = _own_docstring(obj)
        assert doc is not None, f"{pkg.__name__}.{name} has no docstring"
        assert doc.strip(), f"{pkg.__name__}.{name} has an empty docstring"


def test_the_known_gaps_are_exports() -> None:
    exported = {f"{p.__name__}.{n}" for p, n in _exports()}
    assert sorted(UNDOCUMENTED - exported) == []


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.__name__)
def test_the_packages_themselves_have_docstrings(pkg: ModuleType) -> None:
    assert pkg.__doc__ is not None
    assert pkg.__doc__.strip()


def _group(name: str) -> int:
    """isort's order: CONSTANTS, then Classes, then functions."""
    if name.isupper() or (name.replace("_", "").isupper()):
        return 0
    if name[:1].isupper():
        return 1
    return 2


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.__name__)
def test_all_is_alphabetised_within_its_groups(pkg: ModuleType) -> None:
    names = list(pkg.__all__)
    assert len(names) == len(set(names)), "a name is listed twice"
    groups = [_group(n) for n in names]
    assert groups == sorted(groups), f"{pkg.__name__}.__all__ mixes its groups: {names}"
    for group in (0, 1, 2):
        members = [n for n in names if _group(n) == group]
        assert members == sorted(members), f"{pkg.__name__}.__all__ group {group}: {members}"


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.__name__)
def test_star_import_gives_exactly_all(pkg: ModuleType) -> None:
    namespace: dict[str, Any] = {}
    exec(f"from {pkg.__name__} import *", namespace)
    namespace.pop("__builtins__", None)
    assert sorted(namespace) == sorted(pkg.__all__)


def test_private_modules_are_reexported_not_imported() -> None:
    # what __all__ names comes from a private module or a public subpackage
    for name in trio_jobs.__all__:
        obj = getattr(trio_jobs, name)
        module = getattr(obj, "__module__", None)
        if module is None or _is_data(obj):
            continue
        assert module.startswith("trio_jobs"), (name, module)
        parts = module.split(".")[1:]
        assert (
            not parts or parts[0].startswith("_") or parts[0] in ("drivers", "errors", "testing")
        ), (
            name,
            module,
        )


def test_the_errors_module_is_public() -> None:
    errors = importlib.import_module("trio_jobs.errors")
    assert errors.JobsError is trio_jobs.JobsError
    assert errors.ErrorCode is trio_jobs.ErrorCode
