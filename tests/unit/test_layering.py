"""Every layer is imported as `tierbroker.<layer>`: the installed package has no other
top-level name. (The layer contracts, import-linter's in pyproject.toml, are checked on
the installed layout: tests/integration/test_packaging.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("protocol", "storage", "rlm", "broker", "pipeline", "testing")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_layers_are_imported_only_under_the_package_name() -> None:
    sources = [ROOT / "setup.py", *ROOT.glob("*/**/*.py")]
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] in LAYERS
        )
        for path in sources
        if ".venv" not in path.parts and "tierbroker" not in path.relative_to(ROOT).parts[:1]
    }
    assert {k: v for k, v in offenders.items() if v} == {}
