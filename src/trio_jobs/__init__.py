"""trio-jobs: durable background jobs and multi-step workflows on Trio.

Declare a job once with :func:`job`, enqueue it from anywhere with
``await my_job.enqueue(input)`` (it joins the ambient transaction), and run it
with a :class:`Worker`. See ``docs/`` for the tutorial.
"""

from ._backfill import backfill
from ._consumer import ConsumerBatch, consumer
from ._context import JobContext, Signal, Steps, run_to_completion
from ._declare import Concurrency, Enqueued, Job, Retry, job
from ._export_rows import export_rows
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
from ._import_rows import ErrorSink, import_rows
from ._observe import WorkerObserver
from ._rate import RateLimiter, rate_limiter
from ._receiver import (
    DEFAULT_WEBHOOK_BODY_LIMIT,
    Answer,
    Inbound,
    ReceivedWebhook,
    Verified,
    verify_body_hmac,
    webhook_receiver,
)
from ._retention import PurgeResult, Retention, purge_expired
from ._rollup import Bucket, refresh_view, rollup
from ._settled import Outcome, Settled
from ._subject import (
    Anonymize,
    Retain,
    Subject,
    define_subject,
    subject_erase,
    subject_export,
    subject_proof,
)
from ._task import Occurrence, TaskView, next_fire, task
from ._time import outside_call
from ._webhook import Endpoint, WebhookDelivery, WebhookEvent, webhook
from ._webhook_ledger import (
    WebhookAttempt,
    WebhookEndpointState,
    WebhookLedger,
    memory_webhook_ledger,
    postgres_webhook_ledger,
)
from ._webhook_signature import verify_webhook_signature
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
    "DEFAULT_WEBHOOK_BODY_LIMIT",
    "MAX_BULK_ROWS",
    "MAX_ENQUEUE_BATCH",
    "MAX_JOB_PAGE",
    "Actor",
    "Anonymize",
    "Answer",
    "BackfillRow",
    "Bucket",
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
