"""Tenancy under an acting actor (issue 15) on the memory driver: the suite in
tests/tenancy_suite.py, which the PostgreSQL and Redis modules run too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tenancy_suite import JOBS, EnqueueUnderAnActor, OperatorUnderAnActor
from trio_jobs import Jobs, memory_driver, open_jobs


class TestMemoryTenancy(EnqueueUnderAnActor, OperatorUnderAnActor):
    @pytest.fixture
    async def jobs(self) -> AsyncIterator[Jobs]:
        async with open_jobs(memory_driver(), jobs=JOBS) as facade:
            yield facade
