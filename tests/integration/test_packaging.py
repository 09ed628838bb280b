"""The built wheel and sdist, as a user gets them: one top-level package laid out by
setup.py's one mapping, the same modules in both, the layer contracts kept in the
installed package, and a plain install that works.

The plain install (`pip install tierbroker-*.whl`, no extras) goes into a fresh
virtualenv; pip takes the dependencies from its index and cache. There it must
read S3 without the broker (a bounded `TieredConsumer` over the tier a real broker
wrote to moto's standalone server) and `tierbroker export` must say in one line
that it needs PySpark.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.integration.broker_process import BrokerProcess
from tests.integration.moto_server import CREDENTIALS, MotoServer
from tests.integration.pipeline_topic import BROKER_OVERRIDES, small_tiered_topic
from tierbroker.pipeline import SPARK_INSTALL

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("protocol", "storage", "rlm", "broker", "pipeline", "testing")

BACKFILL = """
import asyncio, json, sys
from importlib import metadata, util

from tierbroker.pipeline import TieredConsumer


async def backfill(bootstrap: str, storage: str, topic: str, key: str, secret: str) -> list[int]:
    consumer = TieredConsumer(
        topic,
        mode="REMOTE_ONLY",
        bounded=True,
        bootstrap_servers=bootstrap,
        group_id="backfill",
        auto_offset_reset="earliest",
        storage=storage,
        storage_options={
            "storage.aws.access.key.id": key,
            "storage.aws.secret.access.key": secret,
        },
    )
    await consumer.start()
    try:
        return [record.offset async for record in consumer]
    finally:
        await consumer.stop()


offsets = asyncio.run(backfill(*sys.argv[1:]))
layers = {"protocol", "storage", "rlm", "broker", "pipeline", "testing"}
print(json.dumps({
    "offsets": offsets,
    "installed": sorted({f.parts[0] for f in metadata.files("tierbroker") if f.parts[0] != ".."}),
    "extras_present": [m for m in ("boto3", "pyspark", "pyarrow", "uvloop") if util.find_spec(m)],
    "layers_loaded": sorted(set(sys.modules) & layers),
    "layers_importable": sorted(layer for layer in layers if util.find_spec(layer)),
}))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tracked files: a build in the tree leaves build/ behind, whose stale
    modules a later build would ship."""
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    for name in filter(None, tracked.stdout.split("\0")):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return source


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("wheel")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path)]
    built = subprocess.run([*pip_wheel, str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (found,) = tmp_path.glob("tierbroker-*.whl")
    return found


def test_the_tree_holds_no_symbolic_links() -> None:
    staged = subprocess.run(
        ["git", "ls-files", "--stage"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert [line for line in staged.stdout.splitlines() if line.startswith("120000")] == []


def test_the_sdist_and_the_wheel_hold_the_same_modules(source: Path, wheel: Path) -> None:
    out = source.parent / "sdist"
    build = "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    built = subprocess.run(
        [sys.executable, "-c", build, str(out)], cwd=source, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    (sdist,) = out.glob("tierbroker-*.tar.gz")
    with tarfile.open(sdist) as archive:
        # tierbroker-0.1.0/broker/x.py is installed as tierbroker/broker/x.py
        in_sdist = {
            name if name.startswith("tierbroker/") else f"tierbroker/{name}"
            for member in archive.getnames()
            for name in [member.split("/", 1)[1] if "/" in member else ""]
            if name.split("/")[0] in {"tierbroker", *LAYERS} and name.endswith((".py", ".pyi"))
        }
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name for name in archive.namelist() if name.endswith((".py", ".pyi"))}
        assert "tierbroker/py.typed" in archive.namelist()
    assert in_sdist == in_wheel
    assert "tierbroker/broker/cli/main.py" in in_wheel


def test_the_installed_package_keeps_the_layer_contracts(wheel: Path, tmp_path: Path) -> None:
    """import-linter's contracts (pyproject.toml) over the package as the wheel lays it out:
    import-linter reads files, and the editable install maps folders by an import hook."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), "import-linter is missing: pip install -e '.[test]'"
    run = subprocess.run(
        [lint_imports, "--config", ROOT / "pyproject.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]


def test_the_wheel_holds_one_top_level_package_and_its_command(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"tierbroker"}
    for layer in LAYERS:
        assert f"tierbroker/{layer}/__init__.py" in names
    assert "tierbroker/pipeline/spark/source.py" in names
    assert "tierbroker = tierbroker.broker.cli.main:main" in scripts
    assert "[pytest11]\ntierbroker = tierbroker.testing.plugin" in scripts


@pytest.mark.slow
def test_a_plain_install_reads_s3_without_the_broker(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Nothing of this checkout may leak into the virtualenv's processes.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [venv / "bin/python", "-m", "pip", "install", "-q", "--prefer-binary", str(wheel)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr

    server = MotoServer().start()
    try:
        server.create_bucket("lake")
        overrides = {
            **BROKER_OVERRIDES,
            **server.rsm_overrides("lake"),
            "rsm.config.key.prefix": "tiered/",
        }
        (tmp_path / "broker").mkdir()
        broker = BrokerProcess(tmp_path / "broker", overrides).start()
        try:
            end = small_tiered_topic(broker, "events")["remote_log_end_offset"] + 1
            storage = f"s3://lake/tiered/?endpoint={server.endpoint}&path_style=true"
            # In a folder of its own: the script's folder is on its import path.
            script = tmp_path / "script" / "backfill.py"
            script.parent.mkdir()
            script.write_text(BACKFILL)
            args = [broker.bootstrap, storage, "events", *CREDENTIALS.values()]
            ran = subprocess.run(
                [venv / "bin/python", script, *args],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp_path,
                timeout=300,
            )
            assert ran.returncode == 0, ran.stderr
            report = json.loads(ran.stdout)
            assert report["offsets"] == list(range(end))
            assert report["installed"] == ["tierbroker", "tierbroker-0.1.0.dist-info"]
            assert report["extras_present"] == [] and report["layers_loaded"] == []
            assert report["layers_importable"] == []  # only as tierbroker.<layer>

            export = subprocess.run(
                [
                    venv / "bin/tierbroker",
                    "export",
                    "--storage",
                    storage,
                    "--topic",
                    "events",
                    "--to",
                    str(tmp_path / "lake"),
                ],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp_path,
            )
            assert export.returncode == 1
            assert export.stdout == ""
            assert export.stderr == (f"tierbroker export needs PySpark: {SPARK_INSTALL}\n")
        finally:
            broker.stop()
    finally:
        server.stop()
