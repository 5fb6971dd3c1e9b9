"""docs/how-to/child-jobs.md: the page's program prints what the page says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs"


async def test_the_child_jobs_program_prints_what_the_page_shows(
    autojump_clock: Any, capsys: Any
) -> None:
    text = (DOCS / "how-to" / "child-jobs.md").read_text(encoding="utf-8")
    source = re.search(r"```python\n(.*?)```", text, re.S)
    assert source is not None
    namespace: dict[str, Any] = {"__name__": "child_jobs_howto"}
    exec(compile(source.group(1), "child-jobs.md", "exec"), namespace)
    await namespace["main"]()
    out = capsys.readouterr().out.splitlines()
    assert out == ["done {'one': 9, 'sum': 14}", "5"]
