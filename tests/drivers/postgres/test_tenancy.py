"""Tenancy under an acting actor (issue 15) on the PostgreSQL driver: the suite in
tests/tenancy_suite.py, unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tenancy_suite import JOBS, EnqueueUnderAnActor, OperatorUnderAnActor
from trio_jobs import Jobs, open_jobs, postgres_driver

pytestmark = pytest.mark.postgres


class TestPostgresTenancy(EnqueueUnderAnActor, OperatorUnderAnActor):
    @pytest.fixture
    async def jobs(self, pg_dsn: str, pg_schema: str) -> AsyncIterator[Jobs]:
        async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema), jobs=JOBS) as facade:
            yield facade
