"""The built wheel puts one top-level package into a user's environment: `tierbroker`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_one_top_level_package_and_its_command(tmp_path: Path) -> None:
    # Built from a copy of the tracked files: a build in the tree leaves build/ behind,
    # whose stale modules a later wheel would ship.
    source = tmp_path / "source"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    for name in filter(None, tracked.stdout.split("\0")):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target, follow_symlinks=False)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path)]
    built = subprocess.run([*pip_wheel, str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("tierbroker-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"tierbroker"}
    for layer in ("protocol", "storage", "rlm", "broker", "pipeline"):
        assert f"tierbroker/{layer}/__init__.py" in names
    assert "tierbroker/pipeline/spark/source.py" in names
    assert "tierbroker = tierbroker.broker.cli:main" in scripts
