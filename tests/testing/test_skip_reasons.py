"""Every skip says why: a ``pytest.skip(reason)`` raised inside a Trio test (or
a Trio fixture, as the conformance suite's capability checks are) keeps its
reason and its line in the summary. pytest-trio alone reports it as a bare
``Skipped`` at a line of pytest's own; the trio-jobs pytest plugin puts the
reason back."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

TESTS = textwrap.dedent(
    """
    import pytest
    import trio

    @pytest.fixture
    async def capability():
        pytest.skip("the fake driver declares no introspection")
        yield

    async def test_in_a_trio_test():
        await trio.sleep(0)
        pytest.skip("a reason from a Trio test")

    async def test_in_a_trio_fixture(capability):
        pass

    async def test_in_a_nursery():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            pytest.skip("a reason from inside a nursery")

    def test_in_a_plain_test():
        pytest.skip("a reason from a plain test")

    async def test_a_failure_still_fails():
        raise AssertionError("a real failure")
    """
)


def test_a_skip_inside_trio_keeps_its_reason(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_skips.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    out = proc.stdout
    assert "1 failed, 4 skipped" in out, out
    assert "python.py" not in out  # no skip located in pytest's own code
    assert ": Skipped" not in out
    for reason, line in (
        ("a reason from a Trio test", 12),
        ("the fake driver declares no introspection", 7),
        ("a reason from inside a nursery", 20),
        ("a reason from a plain test", 23),
    ):
        assert f"test_skips.py:{line}: {reason}" in out, (reason, out)
