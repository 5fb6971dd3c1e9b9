"""A real worker process killed with SIGKILL mid-step, and the job resumed by
another process: the step that completed is replayed from Redis, the one cut
short runs again, and the job ends done once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from .conftest import pytestmark as _skip_without_redis

pytestmark = [_skip_without_redis, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("crash_worker.py")


def _spawn(url: str, prefix: str, marks: Path, mode: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), url, prefix, str(marks), mode],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _lines(marks: Path) -> list[str]:
    return marks.read_text().splitlines() if marks.exists() else []


async def test_sigkill_mid_step_then_resume(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    first = _spawn(redis_url, redis_prefix, marks, "hang")
    try:
        with trio.fail_after(30):
            while "two:start" not in _lines(marks):
                assert first.poll() is None, first.stderr.read() if first.stderr else b""
                await trio.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    assert _lines(marks) == ["one", "two:start"]

    second = _spawn(redis_url, redis_prefix, marks, "finish")
    try:
        with trio.fail_after(60):
            while second.poll() is None:  # noqa: ASYNC110 — exits once the job is done
                await trio.sleep(0.05)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert second.returncode == 0, second.stderr.read() if second.stderr else b""
    # "one" was replayed from storage; "two" ran again from its start; done once.
    assert _lines(marks) == ["one", "two:start", "two:start", "two:done", "done"]
