"""docs/how-to/act-for-one-tenant.md runs as shown and prints what its comments say."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "how-to" / "act-for-one-tenant.md"


def test_the_how_to_runs_as_shown(tmp_path: pathlib.Path) -> None:
    [block] = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.S | re.M)
    script = tmp_path / "tenancy_howto.py"
    script.write_text(block, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    # each print(...) is followed by a comment giving what it prints
    promised = [c.split(":")[0].strip() for c in re.findall(r"print\(.*\)\s+# (.*)", block)]
    assert done.stdout.split() == promised
