"""Tenancy under an acting actor (issue 15) on the Redis driver: the enqueue half
of tests/tenancy_suite.py (the Redis driver has no operator surface yet:
``jobs.show``/``list``/... answer ``X_NOT_IMPLEMENTED`` under any actor)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tenancy_suite import JOBS, EnqueueUnderAnActor, bob
from trio_jobs import ErrorCode, Jobs, JobsError, acting_as, open_jobs, redis_driver


class TestRedisTenancy(EnqueueUnderAnActor):
    @pytest.fixture
    async def jobs(self, redis_url: str, redis_prefix: str) -> AsyncIterator[Jobs]:
        async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=JOBS) as facade:
            yield facade

    async def test_the_operator_surface_is_not_implemented_under_any_actor(
        self, jobs: Jobs
    ) -> None:
        with acting_as(bob()):
            with pytest.raises(JobsError) as caught:
                await jobs.list()
            assert caught.value.code == ErrorCode.X_NOT_IMPLEMENTED
