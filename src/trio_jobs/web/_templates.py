"""The dashboard's templates: Jinja2 with autoescape on, one template per page.

Every page renders a template under ``templates/`` (shipped as package data)
extending ``base.html``; shared fragments are macros in ``macros.html``. Every
value a template prints is escaped by Jinja2 unless it is :class:`Markup`, and
the only Markup made here is :func:`json_text`'s (the JSON text, escaped) and
the numbers of a sparkline. The helpers below are plain functions of data
(times, durations, sparkline points), registered as filters and globals.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import jinja2
import orjson
from markupsafe import Markup

__all__ = [
    "MAX_JSON",
    "REDACTED",
    "ago",
    "environment",
    "href",
    "json_text",
    "seconds",
    "spark_points",
    "stamp",
]

#: What a hidden value renders as.
REDACTED = "[redacted]"
#: The most characters of one JSON value a page shows.
MAX_JSON = 8_000


def href(root: str, path: str, query: Mapping[str, Any] | None = None) -> str:
    """``root + path`` with the non-empty ``query`` items (escaped where printed)."""
    full = root.rstrip("/") + path
    items = {k: v for k, v in (query or {}).items() if v not in (None, "")}
    if items:
        full += "?" + urlencode(items)
    return full


def stamp(epoch: float | None) -> tuple[str, str] | None:
    """``(ISO 8601, readable UTC)`` of an epoch time, ``None`` for none."""
    if epoch is None or not math.isfinite(epoch) or epoch <= 0:
        return None
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    return moment.isoformat(), f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def ago(epoch: float | None, now: float) -> str:
    """``12s ago``, ``in 3m``, ``now``; ``—`` for none."""
    if epoch is None or epoch <= 0 or not math.isfinite(epoch):
        return "—"
    delta = now - epoch
    future = delta < 0
    delta = abs(delta)
    if delta < 1:
        return "now"
    if delta < 90:
        text = f"{delta:.0f}s"
    elif delta < 5400:
        text = f"{delta / 60:.0f}m"
    elif delta < 172800:
        text = f"{delta / 3600:.0f}h"
    else:
        text = f"{delta / 86400:.0f}d"
    return f"in {text}" if future else f"{text} ago"


def seconds(value: float | None) -> str:
    """A duration for a person: ``<1 ms``, ``42 ms``, ``3.4 s``, ``12 min``."""
    if value is None or not math.isfinite(value) or value < 0:
        return "—"
    if value < 0.001:
        return "<1 ms"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.0f} min"


def json_text(value: Any) -> Markup:
    """A JSON value as indented text for a ``pre`` block, cut at :data:`MAX_JSON`
    characters, HTML-escaped (quotes included) once, here."""
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()
    if len(text) > MAX_JSON:
        text = text[:MAX_JSON] + f"\n… ({len(text) - MAX_JSON} more characters)"
    return Markup(html.escape(text, quote=True))


#: A sparkline's size in CSS pixels.
SPARK_WIDTH, SPARK_HEIGHT = 120, 26


def spark_points(series: Sequence[float], peak: float, n: int) -> str:
    """The ``points`` of a sparkline's polyline: numbers only."""
    step = SPARK_WIDTH / (max(n, 2) - 1)
    return " ".join(
        f"{i * step:.1f},{SPARK_HEIGHT - 2 - (v / peak) * (SPARK_HEIGHT - 4):.1f}"
        for i, v in enumerate(series)
    )


def _first_line(text: str | None, limit: int = 160) -> str:
    line = (text or "").split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _strip_code(message: str, code: str | None) -> str:
    """An error line without the ``X_CODE: `` it starts with (shown beside it)."""
    if code and message.startswith(f"{code}: "):
        return message[len(code) + 2 :]
    return message


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trio_jobs.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )
    env.filters.update(
        ago=ago,
        seconds=seconds,
        stamp=stamp,
        json_text=json_text,
        first_line=_first_line,
        plural=_plural,
        strip_code=_strip_code,
    )
    env.globals.update(
        href=href,
        spark_points=spark_points,
        SPARK_WIDTH=SPARK_WIDTH,
        SPARK_HEIGHT=SPARK_HEIGHT,
        REDACTED=REDACTED,
    )
    return env


_ENV: jinja2.Environment | None = None


def environment() -> jinja2.Environment:
    """The one environment (templates are compiled once, on first use)."""
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    return _ENV
