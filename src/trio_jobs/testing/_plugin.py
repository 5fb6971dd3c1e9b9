"""The pytest plugin: a ``jobs_harness`` fixture, so app tests need no boilerplate.

>>> async def test_onboard(jobs_harness):
...     trace = await jobs_harness.run(onboard_org, Onboard(org_id=ORG))
...     assert trace.state == "done"
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator

import pytest

from ._check_plugin import pytest_addoption, pytest_collection_modifyitems
from ._harness import Harness, open_harness

# `pytest --trio-jobs-check=MODULE` (the hooks live in _check_plugin.py).
__all__ = ["pytest_addoption", "pytest_collection_modifyitems"]

try:
    from pytest_trio import trio_fixture  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - pytest-trio is a test extra
    trio_fixture = None


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Keep the reason of a skip raised inside a Trio test.

    pytest-trio (0.8) turns a ``pytest.skip(reason)`` raised in a Trio test or
    fixture, which reaches it inside an exception group, into a bare
    ``pytest.skip()``: the summary then reads ``Skipped`` at a line of pytest's
    own. The skip it replaced is the new one's ``__context__``; raise that one,
    with its reason and the line that raised it (the conformance suite's
    "the redis driver declares no introspection", say)."""
    try:
        return (yield)
    except pytest.skip.Exception as exc:
        original = _lone_skip(exc)
        if original is None:
            raise
        raise original from None


def _lone_skip(exc: BaseException) -> BaseException | None:
    """The skip a reasonless one replaced: the single leaf of the exception
    group it was raised while handling, when that leaf is a skip with a reason."""
    if getattr(exc, "msg", None) or not isinstance(exc.__context__, BaseExceptionGroup):
        return None
    leaves: list[BaseException] = []
    queue: list[BaseException] = [exc.__context__]
    while queue:
        item = queue.pop()
        if isinstance(item, BaseExceptionGroup):
            queue.extend(item.exceptions)
        else:
            leaves.append(item)
    if len(leaves) == 1 and isinstance(leaves[0], pytest.skip.Exception) and leaves[0].msg:
        return leaves[0]
    return None


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
