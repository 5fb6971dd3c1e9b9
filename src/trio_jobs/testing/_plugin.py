"""The pytest plugin: a ``jobs_harness`` fixture, so app tests need no boilerplate.

>>> async def test_onboard(jobs_harness):
...     trace = await jobs_harness.run(onboard_org, Onboard(org_id=ORG))
...     assert trace.state == "done"
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ._harness import Harness, open_harness

try:
    from pytest_trio import trio_fixture  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - pytest-trio is a test extra
    trio_fixture = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "jobs(*handles): jobs registered with the jobs_harness fixture"
    )


if trio_fixture is not None:

    @trio_fixture  # type: ignore[untyped-decorator]
    async def jobs_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        """An open harness; jobs come from ``@pytest.mark.jobs(a, b)`` or register on first ``run``."""
        marker = request.node.get_closest_marker("jobs")
        handles = list(marker.args) if marker is not None else []
        async with open_harness(jobs=handles) as harness:
            yield harness
