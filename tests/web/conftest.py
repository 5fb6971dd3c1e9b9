import pathlib
import sys

import pytest

# Importlib mode adds nothing to sys.path: make tests/jobs_support.py and this
# folder's helpers (asgi.py, browser.py) importable.
_HERE = pathlib.Path(__file__).resolve().parent
for path in (str(_HERE.parent), str(_HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

pytest.importorskip("starlette", reason="the dashboard needs the `web` extra")
pytest.importorskip("hypercorn", reason="the dashboard needs the `web` extra")
pytest.importorskip("prometheus_client", reason="metrics need the `web` extra")
pytest.importorskip("jinja2", reason="the dashboard's templates need the `web` extra")
