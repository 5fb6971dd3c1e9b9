"""The Lua scripts, read once from ``lua/*.lua`` (package data).

``queue.lua`` holds the ``prelude`` and the queue's scripts; another file (such
as ``tasks.lua``) holds scripts of one more area, on the same prelude. Each
named script is the shared prelude plus its own body. ``_client.Scripts``
registers each with coredis, which calls it by digest (``EVALSHA``) and, when
the server forgot it (a restart, ``SCRIPT FLUSH``), loads it and repeats the
call once; the driver loads them all when it opens.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = ["SCRIPT_NAMES", "script_source"]

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
#: The files, the prelude's first: names are unique across them.
_FILES = ("queue.lua", "tasks.lua", "operate.lua")


@functools.cache
def _sections() -> dict[str, str]:
    root = resources.files("trio_jobs.drivers.redis").joinpath("lua")
    sections: dict[str, str] = {}
    for file in _FILES:
        parts = _NAME_RE.split(root.joinpath(file).read_text("utf-8"))
        # parts: [header, name1, body1, name2, body2, ...]
        for i in range(1, len(parts), 2):
            if parts[i] in sections:
                raise RuntimeError(f"Lua script {parts[i]!r} is named twice")
            sections[parts[i]] = parts[i + 1]
    return sections


@functools.cache
def script_source(name: str) -> str:
    """The full text of script ``name``: the prelude, then its body."""
    sections = _sections()
    return sections["prelude"] + "\n" + sections[name]


SCRIPT_NAMES: tuple[str, ...] = tuple(n for n in _sections() if n != "prelude")
