"""The built wheel, as a user gets it: one top-level package, and a plain install that works.

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
import zipfile
from pathlib import Path

import pytest

from tests.integration.broker_process import BrokerProcess
from tests.integration.moto_server import CREDENTIALS, MotoServer
from tests.integration.pipeline_topic import BROKER_OVERRIDES, small_tiered_topic

ROOT = Path(__file__).resolve().parents[2]

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
layers = {"protocol", "storage", "rlm", "broker", "pipeline"}
print(json.dumps({
    "offsets": offsets,
    "installed": sorted({f.parts[0] for f in metadata.files("tierbroker") if f.parts[0] != ".."}),
    "extras_present": [m for m in ("boto3", "pyspark", "pyarrow", "uvloop") if util.find_spec(m)],
    "layers_loaded": sorted(set(sys.modules) & layers),
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of the tracked files: a build in the tree leaves build/ behind,
    # whose stale modules a later wheel would ship.
    tmp_path = tmp_path_factory.mktemp("wheel")
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
    (found,) = tmp_path.glob("tierbroker-*.whl")
    return found


def test_the_wheel_holds_one_top_level_package_and_its_command(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"tierbroker"}
    for layer in ("protocol", "storage", "rlm", "broker", "pipeline", "testing"):
        assert f"tierbroker/{layer}/__init__.py" in names
    assert "tierbroker/pipeline/spark/source.py" in names
    assert "tierbroker = tierbroker.broker.cli:main" in scripts
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
            script = tmp_path / "backfill.py"
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
            assert export.stderr == (
                "tierbroker export needs PySpark: pip install 'tierbroker[spark]'\n"
            )
        finally:
            broker.stop()
    finally:
        server.stop()
