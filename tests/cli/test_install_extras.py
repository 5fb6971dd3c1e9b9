"""What the README's first command installs is enough for the dashboard, and a
command that needs a missing extra says so in one line.

A subprocess stands in for a fresh venv: it refuses to import every module of the
installed distributions that the README's install would not bring (the closure of
``trio-jobs[extras]`` over the installed metadata), exactly as Python reports a
package that is not installed. No network, no second venv.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pg_schemas import throwaway_schema

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Runs ``trio-jobs ARGS...`` with the modules named in argv[1] (JSON) not installed.
WITHOUT = """
import json, sys

blocked = frozenset(json.loads(sys.argv[1]))


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
sys.argv = ["trio-jobs", *sys.argv[2:]]
from trio_jobs.cli import main

main()
"""

#: What the dashboard imports: the `web` extra's top-level modules.
WEB_MODULES = ["hypercorn", "jinja2", "prometheus_client", "starlette"]


def readme_first_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^```bash\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert block is not None, "README.md opens with no bash block"
    return block.group(1).splitlines()[0]


def extras_installed_by(command: str) -> set[str]:
    """The extras of the ``pip install -e '.[...]'`` in a shell command line."""
    words = shlex.split(command.replace("&&", " && "))
    pip = words.index(".venv/bin/pip")
    assert words[pip + 1] == "install", command
    targets = [w for w in words[pip + 2 : words.index("&&", pip)] if not w.startswith("-")]
    assert len(targets) == 1, f"expected one thing installed: {command}"
    match = re.fullmatch(r"\.(?:\[([a-z,]+)\])?", targets[0])
    assert match is not None, f"the README installs something else than the clone: {targets[0]}"
    return set(filter(None, (match.group(1) or "").split(",")))


def distributions_installed_by(extras: set[str]) -> set[str]:
    """trio-jobs with ``extras``, as this clone's pyproject.toml declares it, and
    every distribution that pulls in, by the installed metadata."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    roots = list(project["dependencies"])
    for extra in extras:
        roots += project["optional-dependencies"][extra]
    seen: set[str] = {"trio-jobs"}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name == "trio-jobs":  # a self-reference (trio-jobs[test] in dev)
            todo += [
                Requirement(r)
                for extra in req.extras
                for r in project["optional-dependencies"][extra]
            ]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: it cannot be imported in any case
        for raw in requires:
            dep = Requirement(raw)
            envs = [{"extra": e} for e in sorted(req.extras)] + [{"extra": ""}]
            if dep.marker is None or any(dep.marker.evaluate(env) for env in envs):
                todo.append(Requirement(str(dep).split(";")[0]))
    return seen


def modules_outside(distributions: set[str]) -> list[str]:
    """Top-level modules of the installed distributions that are not in the set."""
    blocked = []
    for module, owners in importlib.metadata.packages_distributions().items():
        if module == "trio_jobs" or module in sys.stdlib_module_names:
            continue
        if not any(canonicalize_name(d) in distributions for d in owners):
            blocked.append(module)
    return sorted(blocked)


def trio_jobs(blocked: list[str], *args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, json.dumps(blocked), *args],
        capture_output=True,
        timeout=60,
        env=env,
        **kw,  # type: ignore[call-overload]
    )


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_extras") as dsn:
        yield dsn


def test_the_readme_first_command_installs_the_web_extra() -> None:
    command = readme_first_command()
    assert command.endswith(".venv/bin/trio-jobs dev"), command
    installed = distributions_installed_by(extras_installed_by(command))
    assert {"starlette", "hypercorn", "prometheus-client", "jinja2"} <= installed


def test_the_blocker_stands_for_a_missing_package() -> None:
    """The check below is only as good as this: a blocked module fails to import."""
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT, json.dumps(["click"]), "--help"],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert b"ModuleNotFoundError: No module named 'click'" in proc.stderr


@pytest.mark.postgres
def test_the_dashboard_runs_with_only_what_the_readme_installs(dsn: str) -> None:
    installed = distributions_installed_by(extras_installed_by(readme_first_command()))
    blocked = modules_outside(installed)
    assert "pytest" in blocked  # the test extra is not part of it
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    args = ["dashboard", "--port", "0", "--database-url", dsn]
    proc = subprocess.Popen(
        [sys.executable, "-c", WITHOUT, json.dumps(blocked), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line:  # it ended: say why
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"the dashboard did not start: {err.decode()}")
        assert line.startswith("dashboard: http://127.0.0.1:"), line
        base = line.split()[1].removesuffix("/admin/jobs/")
        for path in ("/admin/jobs/", "/admin/jobs/jobs", "/metrics"):
            with urllib.request.urlopen(base + path, timeout=10) as page:
                assert page.status == 200, path
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


@pytest.mark.parametrize(
    ("args", "command"),
    [(["dashboard"], "trio-jobs dashboard"), (["dev", "--serve"], "trio-jobs dev --serve")],
)
def test_without_the_web_extra_the_command_says_what_to_install(
    args: list[str], command: str, tmp_path: pathlib.Path
) -> None:
    # In an empty folder: were the check late, `dev` would start an embedded server here.
    proc = trio_jobs(WEB_MODULES, *args, cwd=tmp_path)
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 1, proc.stderr.decode()
    assert len(lines) == 1, proc.stderr.decode()
    assert lines[0].startswith(f"X_CONFIG_INVALID: `{command}` serves the dashboard")
    assert "pip install 'trio-jobs[web]'" in lines[0]
    assert proc.stdout == b""
    assert list(tmp_path.iterdir()) == []


def test_without_the_web_extra_other_commands_still_run() -> None:
    proc = trio_jobs(WEB_MODULES, "--help")
    assert proc.returncode == 0, proc.stderr.decode()
    proc = trio_jobs(WEB_MODULES, "dashboard", "--help")
    assert proc.returncode == 0, proc.stderr.decode()
