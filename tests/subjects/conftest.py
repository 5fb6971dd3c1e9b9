import pathlib
import sys

# The suite imports in importlib mode, which adds nothing to sys.path: make the
# shared helpers (tests/pg_schemas.py, tests/jobs_support.py) importable.
_TESTS = str(pathlib.Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
