"""No import loop between the declarations and the facade (issue 13): ``_declare``
never imports ``_facade``, not even inside a method, and the enqueue module
both rely on imports neither of them at run time."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

MODULES = ("trio_jobs._declare", "trio_jobs._facade", "trio_jobs._enqueue")

_PROBE = """
import importlib, json, sys
module = importlib.import_module(sys.argv[1])
print(json.dumps({"file": module.__file__, "package": module.__package__}))
"""


def _load(name: str) -> tuple[ast.Module, str]:
    """Import ``name`` first thing in a fresh interpreter (it must import on its
    own, whichever comes first); answer its parsed source and its package."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, name],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, done.stderr
    where = json.loads(done.stdout)
    with open(where["file"], encoding="utf-8") as source:
        return ast.parse(source.read()), where["package"]


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def imported(name: str, *, at_run_time: bool = False) -> set[str]:
    """Every module ``name``'s source imports, at module level and inside functions
    (``from . import x`` counts as both the package and ``package.x``)."""
    tree, package = _load(name)
    return _imports(tree, package, at_run_time=at_run_time)


def _imports(tree: ast.Module, package: str, *, at_run_time: bool = False) -> set[str]:
    skipped = _type_checking_only(tree) if at_run_time else set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_the_walk_sees_every_kind_of_import() -> None:
    source = ast.parse(
        "import trio\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ._facade import Jobs\n"
        "class Job:\n"
        "    async def enqueue(self):\n"
        "        from ._facade import enqueue_inputs\n"
        "        from . import _ambient\n"
    )
    found = _imports(source, "trio_jobs")
    assert {"trio", "trio_jobs._facade.enqueue_inputs", "trio_jobs._ambient"} <= found
    assert "trio_jobs._facade.Jobs" in found
    assert "trio_jobs._facade.Jobs" not in _imports(source, "trio_jobs", at_run_time=True)
    # And on the real modules: the facade imports the declarations, which import
    # the enqueue module.
    assert "trio_jobs._declare" in imported("trio_jobs._facade")
    assert "trio_jobs._enqueue" in imported("trio_jobs._declare")


def test_declare_never_imports_the_facade() -> None:
    assert "trio_jobs._facade" not in imported("trio_jobs._declare")


@pytest.mark.parametrize("lower", ["trio_jobs._facade", "trio_jobs._declare"])
def test_the_enqueue_module_imports_neither_at_run_time(lower: str) -> None:
    assert lower not in imported("trio_jobs._enqueue", at_run_time=True)
