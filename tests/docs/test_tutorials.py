"""The documentation's code runs as shown.

Every page of docs/ (and the README) with ```` ```python ```` blocks is one
program: its blocks run in the order shown, in one fresh namespace, with nothing
added, and then every ``test_*`` function the page defines runs too. A block not
meant to run says so (```` ```python fragment ````); tutorials have none. A
tutorial also runs as its reader runs it: its blocks in a file, under the
commands its shell blocks show, printing the output it shows. Shell blocks use
the venv's commands.

Page-specific checks (serving the dashboard, scraping metrics, reading the logs'
JSON) are in ``test_howto_pages.py``.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from pg_schemas import throwaway_schema

from ._pages import (
    ROOT,
    blocks,
    load_page,
    output_after,
    page_tests,
    pages_with_python,
    program,
    python_blocks,
    undefined_names,
)

#: Each tutorial, and the file its reader makes of its blocks.
TUTORIALS = {
    "docs/tutorial/first-job.md": "first_job.py",
    "docs/tutorial/first-workflow.md": "first_workflow.py",
}

#: ```python fragment blocks are for quoting the library's own code; keep them rare.
MAX_FRAGMENTS = 4


def test_every_tutorial_is_checked() -> None:
    tutorials = {str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "tutorial").glob("*.md")}
    assert tutorials == set(TUTORIALS)


@pytest.mark.parametrize("page", pages_with_python())
def test_the_python_blocks_run_in_order(page: str) -> None:
    missing = undefined_names(page)
    assert not missing, f"{page} uses names its blocks never define: {missing}"
    module = load_page(page)
    for name, fn in page_tests(module):
        try:
            if inspect.iscoroutinefunction(fn):
                # as pytest-trio runs it, with its autojump_clock: virtual time
                trio.run(fn, clock=MockClock(autojump_threshold=0))
            else:
                fn()
        except Exception as exc:
            raise AssertionError(f"{page}: {name}(), defined by the page, fails: {exc!r}") from exc


@pytest.mark.parametrize("page", sorted(TUTORIALS))
def test_a_tutorial_has_no_fragment(page: str) -> None:
    assert all(b.runs for b in python_blocks(page)), f"{page} marks a block as not run"


def test_fragments_are_rare() -> None:
    fragments = [
        f"{page}, python block {b.number}"
        for page in pages_with_python()
        for b in python_blocks(page)
        if not b.runs
    ]
    assert len(fragments) <= MAX_FRAGMENTS, fragments


def test_a_name_no_block_defines_is_found_without_calling_anything(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport trio\n\nsent = []\n```\n\n```python\n"
        "async def send(to):\n    sent.append(to)\n    outages.pop()\n    trio.sleep(0)\n"
        "    return [x for x in sent if x not in skipped]\n```\n"
    )
    assert undefined_names(os.path.relpath(page, ROOT)) == ["outages", "skipped"]


def test_a_block_that_does_not_run_is_named_by_page_and_number(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n```python fragment\nnot run at all\n```\n\n"
        "```python\ny = x + undefined_name\n```\n"
    )
    relative = os.path.relpath(page, ROOT)
    with pytest.raises(AssertionError, match=r"page\.md, python block 3 \(line 9\) .*NameError"):
        load_page(relative)


# ---------------------------------------------------------------------- as the reader runs it


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=180)


def _venv(command: str) -> list[str]:
    """A shell block's command line, with this interpreter for the venv's."""
    words = command.split()
    assert words[0] == ".venv/bin/python", command
    return [sys.executable, *words[1:]]


@pytest.mark.parametrize("page", sorted(TUTORIALS))
def test_the_tutorial_file_prints_what_the_page_shows(page: str, tmp_path: Path) -> None:
    filename = TUTORIALS[page]
    (tmp_path / filename).write_text(program(page), encoding="utf-8")
    command = f".venv/bin/python {filename}"
    shown = output_after(page, command)
    assert shown is not None, f"{page} shows no output for {command}"
    proc = _run(_venv(command), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == shown.source, f"{page}: `{command}` printed\n{proc.stdout}"


@pytest.mark.parametrize("page", sorted(TUTORIALS))
def test_the_tutorial_tests_pass_under_the_pytest_command_shown(page: str, tmp_path: Path) -> None:
    filename = TUTORIALS[page]
    (tmp_path / filename).write_text(program(page), encoding="utf-8")
    command = f".venv/bin/python -m pytest -o trio_mode=true {filename}"
    output_after(page, command)  # the page shows this command
    expected = len(list(page_tests(load_page(page))))
    assert expected >= 2
    proc = _run(_venv(command), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{expected} passed" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------- shell blocks

#: A command the venv provides; a shell block must not run the system's.
_VENV_COMMANDS = ("python", "python3", "pip", "pip3", "pytest", "trio-jobs", "mypy", "ruff", "nox")
_COMMAND_START = re.compile(
    r"(?:^|&&|\|\||[;|(]|\$\(|\bthen\b|\bdo\b|\bexec\b)\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(\S+)"
)
_ACTIVATE = re.compile(r"^\$?\s*(?:source|\.)\s+\.venv/bin/activate\b", re.MULTILINE)


def _commands(language: str, source: str) -> Iterator[str]:
    """The command lines of a shell block: a console block's ``$`` lines, every
    line of a bash one; a line ending in a backslash joined with the next."""
    logical = re.sub(r"\\\n\s*", " ", source)
    for line in logical.splitlines():
        if language == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            yield line


def _shell_pages() -> list[str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.mark.parametrize("page", _shell_pages())
def test_shell_blocks_run_the_venvs_commands(page: str) -> None:
    activated = False
    for block in blocks(page):
        if block.language not in ("bash", "sh", "shell", "console"):
            continue
        activated = activated or bool(_ACTIVATE.search(block.source))
        if activated:
            continue
        for line in _commands(block.language, block.source):
            for m in _COMMAND_START.finditer(line):
                command = m.group(1)
                if command in _VENV_COMMANDS and not line[m.start(1) :].startswith(
                    "python3 -m venv"
                ):
                    pytest.fail(
                        f"{page}, {block.language} block {block.number} (line {block.line}) "
                        f"runs the system's `{command}`: write .venv/bin/{command}, or "
                        f"activate the venv first: {line}"
                    )


def test_the_shell_check_finds_a_bare_command() -> None:
    found = [
        m.group(1)
        for line in _commands("bash", "FOO=1 python -m x && trio-jobs list | jq .\n# python\n")
        for m in _COMMAND_START.finditer(line)
    ]
    assert found[:2] == ["python", "trio-jobs"]


# ---------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def schema_dsn() -> Iterator[str]:
    with throwaway_schema("tj_docs") as dsn:
        yield dsn


@pytest.mark.postgres
async def test_the_workflow_tutorials_transaction_step_books_once(schema_dsn: str) -> None:
    """first-workflow.md's ``book_charge``: the insert and the step's record commit
    together, and the result is the step's output."""
    from trio_jobs import Worker, open_jobs
    from trio_jobs.drivers.postgres import postgres_driver

    page = load_page("docs/tutorial/first-workflow.md")
    async with open_jobs(postgres_driver(schema_dsn), jobs=[page.book_charge]) as jobs:
        async with jobs.transaction() as tx:
            await tx.execute("create table charges (order_id text primary key, cents int)")
        enq = await page.book_charge.enqueue(page.Order("o-7", 700))
        await Worker(jobs).run_until_quiet()
        view = await jobs.show(enq.id)
        async with jobs.transaction() as tx:
            rows = await tx.execute("select order_id, cents from charges")
    assert view.state == "done"
    assert view.result == {"charged": 700}
    assert [s.name for s in view.steps] == ["charge"]
    assert rows == [("o-7", 700)]
