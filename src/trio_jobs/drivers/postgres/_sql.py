"""Named queries, read from the ``.sql`` files shipped beside this module.

A file holds one area (``queue.sql``, ``steps.sql``, ...). Each query starts at
a ``-- name: NAME`` line and runs to the next one; comments and blank lines
before its first statement line are kept out. Names are unique across files.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = [
    "load_queries",
    "migrations",
    "positional",
    "qualify",
    "query",
    "quote_ident",
    "schema_sql",
]

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


_NAMED_PARAM_RE = re.compile(r"%\((\w+)\)s|%%")


@functools.cache
def positional(name: str) -> tuple[str, tuple[str, ...]]:
    """Query ``name`` with its ``%(param)s`` placeholders as ``$1``, ``$2``, ...
    (one number per distinct name) and the names in that order: the form
    libpq takes directly (``Database.fetch_text``)."""
    names: list[str] = []

    def one(match: re.Match[str]) -> str:
        param = match.group(1)
        if param is None:
            return "%"
        if param not in names:
            names.append(param)
        return f"${names.index(param) + 1}"

    return _NAMED_PARAM_RE.sub(one, query(name)), tuple(names)


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


# --------------------------------------------------------------------------- schema

#: One lexical piece of a statement, leftmost first: a comment, a quoted string,
#: a quoted identifier (each kept whole, so an apostrophe in a comment or a name
#: in a string is not mistaken for code), else a trio-jobs object's name not
#: already qualified, else a call of ``current_schema()``.
_PIECE_RE = re.compile(
    r"""--[^\n]*"""
    r"""|'(?:[^']|'')*'"""
    r'''|"(?:[^"]|"")*"'''
    r"""|(?<![\w.$])trio_jobs_[a-z0-9_]+\b"""
    r"""|\bcurrent_schema\(\s*\)""",
    re.IGNORECASE,
)
_OBJECT_RE = re.compile(r"trio_jobs_[a-z0-9_]+")


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=4096)
def qualify(sql: str, schema: str) -> str:
    """``sql`` with every trio-jobs object named in ``schema``.

    A pooler (PgBouncer in transaction mode) hands each statement to whichever
    server connection is free, and commonly drops the startup ``options`` that
    would set ``search_path``: a statement that leans on the search path would
    read or write another schema's tables, or ``public``'s. So a statement run
    outside a transaction names its objects itself: every ``trio_jobs_*`` name
    becomes ``"schema".trio_jobs_*`` (a string that is exactly such a name, as
    ``to_regclass('trio_jobs_migrations')`` or ``nextval('trio_jobs_claim_seq')``
    takes, likewise), and ``current_schema()`` becomes the schema's name.
    Comments, other strings and quoted identifiers are left as they are.
    (A transaction sets ``search_path`` with ``SET LOCAL`` instead, so an app's
    own statements inside ``jobs.transaction()`` resolve as they always did.)
    The answer is cached: statements are a fixed set of texts."""
    prefix = quote_ident(schema) + "."

    def one(match: re.Match[str]) -> str:
        text = match.group(0)
        head = text[0]
        if head == "'":
            inner = text[1:-1]
            if _OBJECT_RE.fullmatch(inner):
                return "'" + prefix.replace("'", "''") + inner + "'"
            return text
        if head in '-"':
            return text
        if head in "cC":
            return "'" + schema.replace("'", "''") + "'::name"
        return prefix + text

    return _PIECE_RE.sub(one, sql)
