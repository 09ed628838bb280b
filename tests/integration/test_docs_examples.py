"""The pytest plugin's examples (docs/testing.md's and the README's) run as printed, as a
user's test files: in a directory of their own with no conftest, under pytest-asyncio's
default (strict) mode, with the plugin as pip installs it. Only the MinIO endpoint of the
S3 example is moto's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.broker_process import ROOT
from tests.integration.moto_server import MotoServer

GUIDES = (ROOT / "docs" / "testing.md", ROOT / "README.md")
MINIO = "http://127.0.0.1:9000"


@pytest.mark.slow
def test_every_example_of_the_plugin_passes_as_a_users_test(tmp_path: Path) -> None:
    blocks = [
        block
        for guide in GUIDES
        for block in re.findall(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.S)
    ]
    examples = [b for b in blocks if "def test_" in b]
    assert len(examples) == 7, "an example was added or lost: count it here"
    moto = MotoServer().start()
    try:
        moto.create_bucket("tiered")
        for i, example in enumerate(examples):
            (tmp_path / f"test_example_{i}.py").write_text(example.replace(MINIO, moto.endpoint))
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        moto.stop()
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert re.search(r"\b7 passed\b", done.stdout), done.stdout[-2000:]
