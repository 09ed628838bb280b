"""The command line's help, as a user reads it: plain text within 80 columns, every option
described, flags without a value placeholder; and `--version`."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import typer
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

from tierbroker.broker.cli.main import app
from tierbroker.pipeline.jobs import export


def commands() -> list[list[str]]:
    """Every command path: `[]`, `["topic"]`, `["topic", "create"]`, ..."""
    found: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        found.append(path)
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.parametrize("path", commands(), ids=lambda p: " ".join(p) or "tierbroker")
def test_help_fits_80_columns_and_describes_every_option(path: list[str]) -> None:
    shown = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    assert "<bool>" not in shown.output
    assert "│" not in shown.output  # plain text, not panels
    command = typer.main.get_command(app)
    for name in path:
        assert isinstance(command, TyperGroup)
        command = command.commands[name]
    if path == ["export"]:  # the Spark job's own command, which `export` hands its arguments
        command = typer.main.get_command(export.app)
        assert shown.output.startswith("Usage: tierbroker export [OPTIONS]\n"), shown.output
    undescribed = [p.opts[0] for p in command.params if isinstance(p, TyperOption) and not p.help]
    assert undescribed == []


def test_version() -> None:
    shown = CliRunner().invoke(app, ["--version"])
    assert shown.exit_code == 0
    assert shown.output == f"tierbroker {version('tierbroker')}\n"
