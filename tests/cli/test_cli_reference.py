"""docs/reference/cli.md is generated from the click commands: the committed
page must be what docs/gen_cli_reference.py renders now."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

from click.testing import CliRunner

from trio_jobs.cli import main

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
OPERATOR = (
    "list", "show", "retry", "cancel", "resolve-step", "promote", "remove", "requeue",
    "pause", "resume", "stats", "workers", "counters",
)  # fmt: skip


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_cli_reference", DOCS / "gen_cli_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_cli_reference_is_the_generated_one() -> None:
    committed = (DOCS / "reference" / "cli.md").read_text("utf-8")
    assert committed == _generator().render(), "run: python docs/gen_cli_reference.py"


def test_every_operator_command_is_listed_and_documented() -> None:
    out = CliRunner().invoke(main, ["--help"])
    assert out.exit_code == 0
    page = (DOCS / "reference" / "cli.md").read_text("utf-8")
    shapes = _generator().json_shapes()
    for name in OPERATOR:
        assert f"\n  {name} " in out.output, name
        assert f"## `trio-jobs {name}`" in page, name
        assert name in shapes, name
        # --json and --database-url after the subcommand name
        help_ = CliRunner().invoke(main, [name, "--help"])
        assert "--json" in help_.output
        assert "--database-url" in help_.output
