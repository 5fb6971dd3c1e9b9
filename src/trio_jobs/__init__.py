"""trio-jobs: durable background jobs and multi-step workflows on Trio.

Declare a job once with :func:`job`, enqueue it from anywhere with
``await my_job.enqueue(input)`` (it joins the ambient transaction), and run it
with a :class:`Worker`. See ``docs/`` for the tutorial.
"""

from ._backfill import backfill
from ._context import JobContext, Signal, Steps, run_to_completion
from ._declare import Concurrency, Enqueued, Job, Retry, job
from ._facade import (
    Actor,
    Jobs,
    Transaction,
    acting_as,
    cross_tenant,
    current_jobs,
    open_jobs,
    publish_event,
    set_job_driver,
)
from ._observe import WorkerObserver
from ._rate import RateLimiter, rate_limiter
from ._retention import PurgeResult, Retention, purge_expired
from ._rollup import Bucket, refresh_view, rollup
from ._settled import Outcome, Settled
from ._task import Occurrence, TaskView, next_fire, task
from ._worker import Worker, WorkerStats
from .drivers import (
    MAX_BULK_ROWS,
    MAX_ENQUEUE_BATCH,
    MAX_JOB_PAGE,
    BackfillRow,
    JobPage,
    JobView,
    StepView,
    memory_driver,
)
from .drivers.postgres import postgres_driver
from .drivers.redis import redis_driver
from .errors import ErrorCode, JobsError, register_error_retry

__version__ = "0.1.0.dev0"

__all__ = [
    "MAX_BULK_ROWS",
    "MAX_ENQUEUE_BATCH",
    "MAX_JOB_PAGE",
    "Actor",
    "BackfillRow",
    "Bucket",
    "Concurrency",
    "Enqueued",
    "ErrorCode",
    "Job",
    "JobContext",
    "JobPage",
    "JobView",
    "Jobs",
    "JobsError",
    "Occurrence",
    "Outcome",
    "PurgeResult",
    "RateLimiter",
    "Retention",
    "Retry",
    "Settled",
    "Signal",
    "StepView",
    "Steps",
    "TaskView",
    "Transaction",
    "Worker",
    "WorkerObserver",
    "WorkerStats",
    "acting_as",
    "backfill",
    "cross_tenant",
    "current_jobs",
    "job",
    "memory_driver",
    "next_fire",
    "open_jobs",
    "postgres_driver",
    "publish_event",
    "purge_expired",
    "rate_limiter",
    "redis_driver",
    "refresh_view",
    "register_error_retry",
    "rollup",
    "run_to_completion",
    "set_job_driver",
    "task",
]
