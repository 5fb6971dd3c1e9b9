"""Named queries, read from the ``.sql`` files shipped beside this module.

A file holds one area (``queue.sql``, ``steps.sql``, ...). Each query starts at
a ``-- name: NAME`` line and runs to the next one; comments and blank lines
before its first statement line are kept out. Names are unique across files.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = ["load_queries", "migrations", "query", "schema_sql"]

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def _parse(text: str, source: str) -> dict[str, str]:
    out: dict[str, str] = {}
    marks = list(_NAME_RE.finditer(text))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body_lines = text[mark.end() : end].strip().splitlines()
        while body_lines and body_lines[0].lstrip().startswith("--"):
            body_lines.pop(0)
        body = "\n".join(body_lines).strip().rstrip(";").strip()
        name = mark.group(1)
        if name in out:
            raise RuntimeError(f"query {name!r} is named twice in {source}")
        out[name] = body
    return out


@functools.cache
def load_queries() -> dict[str, str]:
    """Every named query of every ``sql/*.sql`` file except ``schema.sql``."""
    queries: dict[str, str] = {}
    root = resources.files(__package__).joinpath("sql")
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql") or entry.name == "schema.sql":
            continue
        for name, body in _parse(entry.read_text("utf-8"), entry.name).items():
            if name in queries:
                raise RuntimeError(f"query {name!r} is named in two files")
            queries[name] = body
    return queries


def query(name: str) -> str:
    return load_queries()[name]


@functools.cache
def migrations() -> tuple[tuple[int, str, str], ...]:
    """``(version, file name, sql)`` for every ``migrations/NNNN_*.sql``, in order."""
    found: list[tuple[int, str, str]] = []
    root = resources.files(__package__).joinpath("migrations")
    for entry in root.iterdir():
        match = re.match(r"^(\d{4})_[a-z0-9_]+\.sql$", entry.name)
        if match is None:
            continue
        found.append((int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort()
    versions = [v for v, _n, _s in found]
    # Numbers are handed out ahead to work landing in parallel, so one that has
    # not landed yet leaves a gap; the migrator applies whatever is pending
    # (recorded per version), so a gap is harmless. Two files of one number,
    # or a number below 1, are a mistake.
    if len(set(versions)) != len(versions) or (versions and versions[0] < 1):
        raise RuntimeError(f"migrations must have distinct numbers from 1, found {versions}")
    return tuple(found)


def schema_sql() -> str:
    """The shipped schema: what replaying every migration must give."""
    return resources.files(__package__).joinpath("sql", "schema.sql").read_text("utf-8")
