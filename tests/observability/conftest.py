import logging
import pathlib
import sys

import pytest

# Importlib mode adds nothing to sys.path: make tests/jobs_support.py importable.
_TESTS = str(pathlib.Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(autouse=True)
def _capture_job_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="trio_jobs")
    return caplog


@pytest.fixture(autouse=True)
def _restore_logging():
    """trio_jobs.logging.configure() changes the trio_jobs logger: put it back."""
    logger = logging.getLogger("trio_jobs")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate
