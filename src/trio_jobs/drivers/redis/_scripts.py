"""The Lua scripts, read once from ``lua/queue.lua`` (package data).

Each named script is the shared prelude plus its own body. They are loaded into
the server once when the driver opens (``SCRIPT LOAD``) and called by digest
(``EVALSHA``); a server that forgot them (a restart, ``SCRIPT FLUSH``) answers
``NOSCRIPT`` and the script is loaded again, once, before the call is repeated.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources

__all__ = ["SCRIPT_NAMES", "script_source", "script_sha"]

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _sections() -> dict[str, str]:
    text = resources.files("trio_jobs.drivers.redis").joinpath("lua/queue.lua").read_text("utf-8")
    parts = _NAME_RE.split(text)
    # parts: [header, name1, body1, name2, body2, ...]
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


@functools.cache
def script_source(name: str) -> str:
    """The full text of script ``name``: the prelude, then its body."""
    sections = _sections()
    return sections["prelude"] + "\n" + sections[name]


@functools.cache
def script_sha(name: str) -> str:
    """The digest ``EVALSHA`` calls script ``name`` by."""
    return hashlib.sha1(script_source(name).encode("utf-8")).hexdigest()


SCRIPT_NAMES: tuple[str, ...] = tuple(n for n in _sections() if n != "prelude")
