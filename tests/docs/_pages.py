"""Read the documentation's code blocks, and run a page's Python as one file.

A page's ```` ```python ```` blocks are one program: run in the order shown, in
one fresh namespace, each may use what the blocks above it defined. A block that
is not meant to run (an excerpt of the library's own code) says so in its info
string, ```` ```python fragment ````, and is skipped. A block's code is
compiled under the name ``<PAGE, python block N>`` (and put in ``linecache``),
so a traceback from it, or from a function it defined, names the page and the
block.
"""

from __future__ import annotations

import builtins
import inspect
import linecache
import pathlib
import re
import symtable
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: A fenced block, at any indentation (a block inside a list item is indented).
_FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ ]*$",
    re.DOTALL | re.MULTILINE,
)

#: The info-string word that marks a Python block not meant to run.
FRAGMENT = "fragment"


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: docs/tutorial/first-job.md
    language: str
    flags: tuple[str, ...]
    line: int  # of the opening fence, 1-based
    source: str  # dedented
    number: int  # among the page's blocks of this language, 1-based
    start: int  # offsets of the whole fenced block in the page
    end: int

    @property
    def runs(self) -> bool:
        return self.language == "python" and FRAGMENT not in self.flags

    @property
    def name(self) -> str:
        return f"<{self.page}, {self.language} block {self.number}>"


def page_path(page: str) -> pathlib.Path:
    return ROOT / page


def blocks(page: str) -> list[Block]:
    """Every fenced block of a page, in order, numbered per language."""
    text = page_path(page).read_text(encoding="utf-8")
    found: list[Block] = []
    counts: dict[str, int] = {}
    for m in _FENCE.finditer(text):
        words = m.group("info").split()
        language = words[0] if words else ""
        counts[language] = counts.get(language, 0) + 1
        found.append(
            Block(
                page=page,
                language=language,
                flags=tuple(words[1:]),
                line=text.count("\n", 0, m.start()) + 1,
                source=textwrap.dedent(m.group("body")),
                number=counts[language],
                start=m.start(),
                end=m.end(),
            )
        )
    return found


def python_blocks(page: str) -> list[Block]:
    return [b for b in blocks(page) if b.language == "python"]


def pages_with_python() -> list[str]:
    """Every page of docs/ (and the README) holding a Python block."""
    paths = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    pages = [str(p.relative_to(ROOT)) for p in paths]
    return [p for p in pages if python_blocks(p)]


def program(page: str) -> str:
    """The page's runnable Python blocks, joined as the one file a reader makes."""
    return "\n\n".join(b.source.strip("\n") + "\n" for b in python_blocks(page) if b.runs)


def undefined_names(page: str) -> list[str]:
    """Names the page's program uses that nothing in it defines and that are not
    builtins: what a run would find only by calling every function."""
    top = symtable.symtable(program(page), page, "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    missing: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if (
                symbol.is_referenced()
                and (symbol.is_global() or table is top)
                and not (table is top and (symbol.is_assigned() or symbol.is_imported()))
                and name not in defined
                and not hasattr(builtins, name)
            ):
                missing.add(name)
        for child in table.get_children():
            walk(child)

    walk(top)
    return sorted(missing)


def load_page(page: str) -> ModuleType:
    """Run the page's Python blocks, in order, in a fresh module; answer it.

    The module is registered in ``sys.modules`` under a fresh name (attrs and
    typing resolve names through it), and is not ``__main__``: a block guarded by
    ``if __name__ == "__main__":`` does not run. A block that raises fails with
    the page, the block's number and its line."""
    name = "docs_page_" + re.sub(r"\W", "_", page.removesuffix(".md")) + "_" + uuid.uuid4().hex[:8]
    module = ModuleType(name)
    module.__file__ = str(page_path(page))
    sys.modules[name] = module
    for block in python_blocks(page):
        if not block.runs:
            continue
        filename = block.name
        linecache.cache[filename] = (
            len(block.source),
            None,
            block.source.splitlines(keepends=True),
            filename,
        )
        try:
            # dont_inherit: not this module's `from __future__ import annotations`;
            # a block's annotations are evaluated as the reader's file evaluates them.
            code = compile(block.source, filename, "exec", dont_inherit=True)
            exec(code, module.__dict__)
        except Exception as exc:
            raise AssertionError(
                f"{page}, python block {block.number} (line {block.line}) does not run as "
                f"shown: {type(exc).__name__}: {exc}"
            ) from exc
    return module


def page_tests(module: ModuleType) -> Iterator[tuple[str, Callable[[], Any]]]:
    """The ``test_*`` functions a page defines, in the order it defines them."""
    for name, value in list(vars(module).items()):
        if name.startswith("test_") and inspect.isfunction(value):
            yield name, value


def output_after(page: str, command: str) -> Block | None:
    """The output block (``text``, ``json``) right after the shell block running
    ``command``, with nothing but blank lines between them; None when the page
    shows no output for it."""
    text = page_path(page).read_text(encoding="utf-8")
    found = blocks(page)
    for i, block in enumerate(found):
        if block.language in ("bash", "console") and command in block.source.splitlines():
            after = found[i + 1] if i + 1 < len(found) else None
            if (
                after is not None
                and after.language in ("text", "json")
                and not text[block.end : after.start].strip()
            ):
                return after
            return None
    raise AssertionError(f"{page} has no shell block running {command!r}")
