"""docs/reference/api.md is generated from the current docstrings."""

from __future__ import annotations

import importlib.util
import pathlib

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def test_the_api_reference_is_generated_from_the_current_docstrings() -> None:
    spec = importlib.util.spec_from_file_location("_docs_gen_reference", DOCS / "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    committed = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    assert committed == gen.render(), (
        "docs/reference/api.md is stale: run .venv/bin/python docs/gen_reference.py"
    )
    assert "(no docstring)" not in committed
