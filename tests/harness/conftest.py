import inspect
import logging
import pathlib
import sys

import pytest

# The suite imports in importlib mode, which adds nothing to sys.path: make the
# shared helpers (tests/jobs_support.py) importable.
_TESTS = str(pathlib.Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from jobs_support import reset_retry_classes  # noqa: E402


@pytest.fixture(autouse=True)
def _virtual_time_only(request):
    """Every async test here runs on Trio's MockClock: no wall-clock sleeps.

    pytest-trio hands ``trio.run`` only a clock the test itself declares, so an
    async test that forgets ``autojump_clock`` would run in real time."""
    if inspect.iscoroutinefunction(request.function):
        if "autojump_clock" not in inspect.signature(request.function).parameters:
            pytest.fail(f"{request.node.name} must take the autojump_clock fixture")


@pytest.fixture(autouse=True)
def _clean_retry_classes():
    yield
    reset_retry_classes()


@pytest.fixture(autouse=True)
def _capture_job_logs(caplog):
    caplog.set_level(logging.DEBUG, logger="trio_jobs")
    return caplog
