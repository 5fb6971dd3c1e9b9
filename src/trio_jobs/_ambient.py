"""Context variables: the ambient facade, transaction, actor and running job."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._context import RunState
    from ._facade import Actor, Jobs, Transaction

facade_var: contextvars.ContextVar[Jobs | None] = contextvars.ContextVar(
    "trio_jobs_facade", default=None
)
tx_var: contextvars.ContextVar[Transaction | None] = contextvars.ContextVar(
    "trio_jobs_tx", default=None
)
actor_var: contextvars.ContextVar[Actor | None] = contextvars.ContextVar(
    "trio_jobs_actor", default=None
)
cross_tenant_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "trio_jobs_cross_tenant", default=None
)
run_var: contextvars.ContextVar[RunState | None] = contextvars.ContextVar(
    "trio_jobs_run", default=None
)
# Which of a worker's tasks is running: "claim", "heartbeat", "progress", "job:<id>", ...
# The simulation orders driver calls by it, so the seed, not Trio's scheduler, decides.
role_var: contextvars.ContextVar[str] = contextvars.ContextVar("trio_jobs_role", default="")
# What the running worker says of its fleet (Worker(fleet=...)): "single" when this
# process is the whole fleet, so a shared rate limit may live in its memory.
fleet_var: contextvars.ContextVar[str] = contextvars.ContextVar("trio_jobs_fleet", default="many")
# Set inside run_to_completion(): writes land even past the abort.
complete_var: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "trio_jobs_complete", default=False
)


def check_not_aborted() -> None:
    """A cancelled body writes nothing: raise the signal's reason when the running
    job's signal is aborted (unless inside ``run_to_completion``)."""
    run = run_var.get()
    if run is None or complete_var.get():
        return
    reason: Any = run.signal.reason
    if reason is not None:
        raise reason
