"""The tutorials' code runs: every example under docs/examples/ is executed here
on Trio's MockClock, and every ``python`` block of a tutorial must be a verbatim
part of its example file, so the prose cannot drift from the code that is run.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
import textwrap
from types import ModuleType
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"

#: tutorial page -> the example file its code blocks come from.
TUTORIALS = {
    "tutorial/first-job.md": "first_job.py",
    "tutorial/first-workflow.md": "first_workflow.py",
}

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def load(filename: str) -> ModuleType:
    """A fresh copy of an example module: its globals (the fakes' records, the
    retry classes it registers) start clean in every test."""
    path = EXAMPLES / filename
    name = f"_docs_example_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # attrs and typing resolve names through sys.modules
    spec.loader.exec_module(module)
    return module


def blocks(page: str) -> list[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return [textwrap.dedent(b).strip("\n") for b in _BLOCK.findall(text)]


@pytest.mark.parametrize("page", sorted(TUTORIALS))
def test_every_code_block_is_part_of_its_example(page: str) -> None:
    source = (EXAMPLES / TUTORIALS[page]).read_text(encoding="utf-8")
    found = blocks(page)
    assert found, f"{page} has no python blocks"
    for block in found:
        lines = block.splitlines()
        # A block may be an indented excerpt (a function's inner lines): match it
        # line by line at any one indentation.
        indents = {len(line) - len(line.lstrip()) for line in source.splitlines()}
        assert any(
            textwrap.indent(block, " " * n, lambda line: bool(line.strip())) in source
            for n in sorted(indents)
        ), f"this block of {page} is not in docs/examples/{TUTORIALS[page]}:\n{lines[0]} ..."


# ---------------------------------------------------------------------- first job


async def test_first_job_main_runs_with_a_real_worker(
    autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load("first_job.py")
    await example.main()
    out = capsys.readouterr().out
    assert out.startswith("done 1 {'message_id': 'msg-1'}")
    assert "send-mail: completed, ran 1x" in out
    assert example.sent == ["ada@example.com: Welcome aboard"]  # deduped: one mail


async def test_first_job_harness_test(autojump_clock: Any) -> None:
    await load("first_job.py").test_send_welcome()


async def test_first_job_retry_test(autojump_clock: Any) -> None:
    example = load("first_job.py")
    await example.test_a_failed_send_is_retried()
    assert example.outages == []


# ---------------------------------------------------------------------- first workflow


async def test_first_workflow_main(autojump_clock: Any, capsys: pytest.CaptureFixture[str]) -> None:
    await load("first_workflow.py").main()
    out = capsys.readouterr().out
    assert "after the first pass: delayed" in out
    assert "after 30 minutes: suspended" in out
    assert "after the confirmation: done" in out


async def test_first_workflow_retries_only_the_failed_step(autojump_clock: Any) -> None:
    await load("first_workflow.py").test_a_failed_step_is_retried_alone()


async def test_first_workflow_compensates_an_unconfirmed_order(autojump_clock: Any) -> None:
    await load("first_workflow.py").test_an_unconfirmed_order_is_refunded()


# ---------------------------------------------------------------------- reference


def test_the_api_reference_is_generated_from_the_current_docstrings() -> None:
    spec = importlib.util.spec_from_file_location("_docs_gen_reference", DOCS / "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    committed = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    assert committed == gen.render(), (
        "docs/reference/api.md is stale: run python docs/gen_reference.py"
    )
    assert "(no docstring)" not in committed
