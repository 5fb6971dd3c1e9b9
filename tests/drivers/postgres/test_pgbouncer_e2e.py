"""The end-to-end worker tests (``test_worker_e2e.py``), unchanged, with ``dsn``
through a real PgBouncer in transaction mode and no ``listen_dsn``: the wake's
probe never comes back through the pooler, the worker says so once and polls.
``sql()`` reads the schema through the pooler too (a transaction that sets its
search path locally)."""

from __future__ import annotations

import pytest

from .pgbouncer import Bouncer
from .test_worker_e2e import (
    test_a_run_waiting_on_a_busy_key_starts_when_the_holder_settles,
    test_a_worker_runs_jobs_enqueued_in_a_transaction,
    test_an_error_message_holding_nul_is_recorded_not_refused,
    test_many_runs_queue_behind_few_keys,
)

pytestmark = pytest.mark.postgres

__all__ = [
    "test_a_run_waiting_on_a_busy_key_starts_when_the_holder_settles",
    "test_a_worker_runs_jobs_enqueued_in_a_transaction",
    "test_an_error_message_holding_nul_is_recorded_not_refused",
    "test_many_runs_queue_behind_few_keys",
]


@pytest.fixture
def pg_dsn(pgbouncer: Bouncer) -> str:
    """The pooled address in place of the server's own, for every test here."""
    return pgbouncer.dsn()
