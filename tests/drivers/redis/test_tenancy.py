"""Tenancy under an acting actor (issue 15) on the Redis driver: the suite in
tests/tenancy_suite.py, unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tenancy_suite import JOBS, EnqueueUnderAnActor, OperatorUnderAnActor
from trio_jobs import Jobs, open_jobs, redis_driver


class TestRedisTenancy(EnqueueUnderAnActor, OperatorUnderAnActor):
    @pytest.fixture
    async def jobs(self, redis_url: str, redis_prefix: str) -> AsyncIterator[Jobs]:
        async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=JOBS) as facade:
            yield facade
