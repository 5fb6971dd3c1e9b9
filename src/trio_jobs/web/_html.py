"""Server-rendered HTML for the dashboard: small helpers, no template engine.

Every dynamic string goes through :func:`esc`; JSON is rendered by orjson and
escaped too. The only script is one inline block (its nonce in the page's CSP)
that refreshes ``#live`` every few seconds while nobody is typing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

import orjson

__all__ = [
    "REDACTED",
    "ago",
    "badge",
    "button_form",
    "esc",
    "json_block",
    "page",
    "seconds",
    "sparkline",
    "stamp",
    "url",
]

REDACTED = "[redacted]"
#: The most characters of one JSON value a page shows.
MAX_JSON = 8_000


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def url(root: str, path: str, query: Mapping[str, Any] | None = None) -> str:
    """``root + path`` with the non-empty ``query`` items, escaped for an attribute."""
    full = root.rstrip("/") + path
    items = {k: v for k, v in (query or {}).items() if v not in (None, "")}
    if items:
        full += "?" + urlencode(items)
    return esc(full)


def stamp(epoch: float | None) -> str:
    if epoch is None or not math.isfinite(epoch) or epoch <= 0:
        return "—"
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    return f'<time datetime="{moment.isoformat()}">{moment:%Y-%m-%d %H:%M:%S} UTC</time>'


def ago(epoch: float | None, now: float) -> str:
    if epoch is None or epoch <= 0:
        return "—"
    delta = now - epoch
    future = delta < 0
    delta = abs(delta)
    if delta < 1:
        text = "now"
    elif delta < 90:
        text = f"{delta:.0f}s"
    elif delta < 5400:
        text = f"{delta / 60:.0f}m"
    elif delta < 172800:
        text = f"{delta / 3600:.0f}h"
    else:
        text = f"{delta / 86400:.0f}d"
    if text == "now":
        return text
    return f"in {text}" if future else f"{text} ago"


def seconds(value: float) -> str:
    """A duration for a person: ``<1 ms``, ``42 ms``, ``3.4 s``, ``12 min``."""
    if value < 0.001:
        return "&lt;1 ms"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.0f} min"


def badge(state: str) -> str:
    return f'<span class="badge s-{esc(state)}">{esc(state)}</span>'


def json_block(value: Any, *, redacted: bool = False) -> str:
    if redacted:
        return f'<pre class="json redacted">{REDACTED}</pre>'
    if value is None:
        return '<pre class="json muted">null</pre>'
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()
    if len(text) > MAX_JSON:
        text = text[:MAX_JSON] + f"\n… ({len(text) - MAX_JSON} more characters)"
    return f'<pre class="json">{esc(text)}</pre>'


def hidden(fields: Mapping[str, str]) -> str:
    return "".join(
        f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items()
    )


def button_form(
    action: str,
    label: str,
    fields: Mapping[str, str],
    *,
    cls: str = "",
    confirm: str | None = None,
    extra: str = "",
) -> str:
    """A POST form with the CSRF token among ``fields`` and one button."""
    data = f' data-confirm="{esc(confirm)}"' if confirm else ""
    return (
        f'<form method="post" action="{action}" class="inline"{data}>'
        f"{hidden(fields)}{extra}"
        f'<button type="submit" class="btn {esc(cls)}">{esc(label)}</button></form>'
    )


def sparkline(values: Sequence[float], failures: Sequence[float] = (), *, title: str = "") -> str:
    """An inline SVG of per-minute counts, oldest first; failures in red."""
    width, height = 120, 26
    peak = max([*values, *failures, 1.0])
    n = max(len(values), 2)

    def points(series: Sequence[float]) -> str:
        step = width / (n - 1)
        return " ".join(
            f"{i * step:.1f},{height - 2 - (v / peak) * (height - 4):.1f}"
            for i, v in enumerate(series)
        )

    lines = f'<polyline class="spark-ok" points="{points(values)}"/>'
    if any(failures):
        lines += f'<polyline class="spark-bad" points="{points(failures)}"/>'
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{esc(title)}"><title>{esc(title)}</title>{lines}</svg>'
    )


STYLE = """
:root{--fg:#1d2430;--muted:#6b7484;--line:#e3e7ee;--bg:#f6f8fb;--card:#fff;--accent:#3056d3}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:var(--fg);background:var(--bg)}
header{display:flex;align-items:center;gap:18px;padding:10px 22px;background:#1d2430;color:#fff}
header .brand{font-weight:700;letter-spacing:.2px}
header nav a{color:#cfd6e4;text-decoration:none;margin-right:14px}
header nav a.on,header nav a:hover{color:#fff}
header .live{margin-left:auto;font-size:12px;color:#cfd6e4}
main{padding:18px 22px;max-width:1280px}
h1{font-size:20px;margin:4px 0 14px}
h2{font-size:15px;margin:22px 0 8px;color:#39414f}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 14px;
margin-bottom:14px}
table{border-collapse:collapse;width:100%;background:var(--card)}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.3px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
a{color:var(--accent)}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px}
.muted{color:var(--muted)}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;
background:#e8ecf3;color:#39414f}
.s-done{background:#dff5e5;color:#17663a}.s-running{background:#dde8ff;color:#2143a8}
.s-ready{background:#eef1f6;color:#39414f}.s-delayed,.s-suspended{background:#fff2d6;color:#8a5a00}
.s-dead,.s-failed{background:#fde2e1;color:#a1221b}.s-cancelled{background:#ece9f5;color:#51437d}
.s-completed{background:#dff5e5;color:#17663a}.s-started,.s-sleeping,.s-waiting{background:#fff2d6;
color:#8a5a00}.s-paused{background:#fde2e1;color:#a1221b}
pre.json{background:#f3f5f9;border:1px solid var(--line);border-radius:6px;padding:8px;margin:4px 0;
max-height:260px;overflow:auto;font-size:12px}
pre.error{background:#fff5f5;border:1px solid #f3c9c7;border-radius:6px;padding:8px;
white-space:pre-wrap;font-size:12px}
.redacted{color:#8a5a00;font-style:italic}
form.inline{display:inline-block;margin:0 6px 4px 0}
.btn{font:inherit;font-size:13px;padding:4px 11px;border-radius:6px;border:1px solid #c7cfdc;
background:#fff;cursor:pointer}
.btn:hover{border-color:var(--accent)}
.btn.primary{background:var(--accent);border-color:var(--accent);color:#fff}
.btn.danger{border-color:#e3a19d;color:#a1221b}
input,select{font:inherit;font-size:13px;padding:4px 6px;border:1px solid #c7cfdc;border-radius:5px}
.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end}
.filters label{display:flex;flex-direction:column;font-size:12px;color:var(--muted)}
.pager{display:flex;gap:12px;margin-top:10px}
.flash{padding:8px 12px;border-radius:6px;margin-bottom:12px}
.flash.ok{background:#dff5e5;color:#17663a}.flash.bad{background:#fde2e1;color:#a1221b}
.timeline{list-style:none;padding:0;margin:0}
.timeline li{border-left:3px solid var(--line);padding:6px 0 8px 14px;margin-left:6px;position:relative}
.timeline li:before{content:"";position:absolute;left:-8px;top:10px;width:11px;height:11px;
border-radius:50%;background:#c7cfdc}
.timeline li.completed:before{background:#2f9e5b}.timeline li.failed:before{background:#d2443b}
.timeline li.started:before,.timeline li.sleeping:before,.timeline li.waiting:before{background:#e0a100}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:14px}
dl.facts{display:grid;grid-template-columns:150px 1fr;gap:4px 12px;margin:0}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0}
progress{width:220px;height:10px;vertical-align:middle;accent-color:var(--accent)}
h2.first{margin-top:0}
svg.spark{vertical-align:middle}
svg.spark polyline{fill:none;stroke-width:1.6}
.spark-ok{stroke:#3056d3}.spark-bad{stroke:#d2443b}
"""

SCRIPT = """
(function(){
  document.addEventListener('submit', function(e){
    var f = e.target, q = f.getAttribute && f.getAttribute('data-confirm');
    if (q && !window.confirm(q)) { e.preventDefault(); }
  });
  var box = document.getElementById('live'), on = document.getElementById('live-on');
  if (!box || !on) { return; }
  setInterval(function(){
    var a = document.activeElement;
    if (!on.checked || document.hidden) { return; }
    if (a && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName)) { return; }
    fetch(location.href, {credentials: 'same-origin', headers: {'X-Live': '1'}})
      .then(function(r){ return r.ok ? r.text() : null; })
      .then(function(t){
        if (!t) { return; }
        var doc = new DOMParser().parseFromString(t, 'text/html');
        var fresh = doc.getElementById('live');
        if (fresh) { box.innerHTML = fresh.innerHTML; }
      })
      .catch(function(){});
  }, 5000);
})();
"""

NAV = (
    ("overview", "/", "Overview"),
    ("jobs", "/jobs", "Jobs"),
    ("dead", "/dead", "Dead letters"),
    ("workers", "/workers", "Workers"),
)


def page(
    *,
    title: str,
    body: str,
    root: str,
    nonce: str,
    active: str,
    flash: str = "",
    live: bool = True,
) -> str:
    links = "".join(
        f'<a href="{url(root, path)}" class="{"on" if key == active else ""}">{esc(label)}</a>'
        for key, path, label in NAV
    )
    links += f'<a href="{url(root, "/metrics")}">Metrics</a>'
    toggle = (
        '<label class="live"><input type="checkbox" id="live-on" checked> live refresh</label>'
        if live
        else ""
    )
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="same-origin">'
        f"<title>{esc(title)} · trio-jobs</title>"
        f'<style nonce="{esc(nonce)}">{STYLE}</style></head>'
        f'<body><header><span class="brand">trio-jobs</span><nav>{links}</nav>{toggle}</header>'
        f'<main>{flash}<div id="live">{body}</div></main>'
        f'<script nonce="{esc(nonce)}">{SCRIPT}</script></body></html>'
    )


def table(head: Iterable[str], rows: Iterable[str], *, empty: str = "Nothing here.") -> str:
    cells = "".join(head)
    body = "".join(rows)
    if not body:
        return f'<p class="muted">{esc(empty)}</p>'
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"
