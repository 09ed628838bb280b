"""The plugin as pytest sees it: loaded through the package's `pytest11` entry point,
and inert until a test asks for a fixture (no broker module imported, no thread)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

INERT = """
import sys, threading

def test_nothing_started():
    assert "tierbroker.testing.plugin" in sys.modules
    assert "tierbroker.broker" not in sys.modules
    assert [t.name for t in threading.enumerate()] == ["MainThread"]
"""


def test_pytest_loads_the_plugin_through_its_entry_point(pytestconfig: pytest.Config) -> None:
    (entry,) = [e for e in entry_points(group="pytest11") if e.name == "tierbroker"]
    assert entry.value == "tierbroker.testing.plugin"
    plugin = pytestconfig.pluginmanager.get_plugin("tierbroker")
    assert plugin is not None and plugin.__name__ == "tierbroker.testing.plugin"


def test_a_suite_that_uses_no_fixture_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "test_inert.py").write_text(INERT)

    def pytest_run(*options: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *options],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    assert "1 passed" in pytest_run("-q")
    listed = pytest_run("--fixtures")
    assert "tierbroker_cluster -- " in listed and "tierbroker -- " in listed
