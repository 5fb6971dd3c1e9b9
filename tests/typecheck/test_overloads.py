"""The type checker flags a job() without an idempotency key, and infers Job[I, R]."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e .[test]")

SNIPPET = textwrap.dedent(
    """
    import attrs
    from trio_jobs import JobContext, job

    @attrs.frozen
    class In:
        n: int

    @job(input=In)  # E: missing idempotency_key
    async def missing(ctx: JobContext[In]) -> None: ...

    @job(input=In, idempotency_key=None)  # E: None is not a key function
    async def none_key(ctx: JobContext[In]) -> None: ...

    @job(input=In, idempotency_key=lambda i: f"k:{i.n}")
    async def good(ctx: JobContext[In]) -> int:
        return ctx.input.n

    reveal_type(good)

    async def use() -> None:
        await good.enqueue(In(n=1))
        await good.enqueue("wrong")  # E: wrong input type
    """
)


def test_mypy_flags_missing_keys_and_wrong_inputs(tmp_path: Path) -> None:
    source = tmp_path / "snippet.py"
    source.write_text(SNIPPET)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--strict",
            "--no-error-summary",
            str(source),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    out = proc.stdout
    lines = {
        int(line.split(":")[1]): line for line in out.splitlines() if line.startswith(str(source))
    }
    src_lines = SNIPPET.splitlines()

    def line_of(marker: str) -> int:
        return next(i for i, text in enumerate(src_lines, start=1) if marker in text)

    assert "error" in lines.get(line_of("# E: missing idempotency_key"), ""), out
    assert "error" in lines.get(line_of("# E: None is not a key function"), ""), out
    assert "error" in lines.get(line_of("# E: wrong input type"), ""), out
    assert "Job[snippet.In, int]" in lines.get(line_of("reveal_type(good)"), ""), out
