"""The README's shell examples run as written, against a broker started with the shipped
config; only its ports differ (9092 and 9404 are `make run`'s), so nothing collides."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.broker_process import ROOT, BrokerProcess, executable

README = ROOT / "README.md"


def sh_blocks(heading: str) -> list[str]:
    """The ```sh blocks under `heading` (a line of the README), up to the next heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    following = re.search(r"\n#{1,6} ", text[start + len(heading) + 2 :])
    end = start + len(heading) + 2 + following.start() if following else len(text)
    return re.findall(r"```sh\n(.*?)```", text[start:end], flags=re.DOTALL)


def run(block: str, broker: BrokerProcess, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`block` in bash, stopping at the first failure, with the broker's ports in it."""
    script = block.replace("127.0.0.1:9092", broker.bootstrap).replace(
        "127.0.0.1:9404", f"127.0.0.1:{broker.metrics_port}"
    )
    executable("kcat", "apt-get install kcat")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # the venv's commands
        "TIERBROKER_BOOTSTRAP": broker.bootstrap,  # where the README's commands default to 9092
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{script}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("readme")).start()
    yield b
    b.kill()


def test_quick_start(broker: BrokerProcess, tmp_path: Path) -> None:
    _make, kcat = sh_blocks("## Quick start")
    assert run(kcat, broker, tmp_path).stdout.splitlines() == ["hello"]


def test_everyday_commands(broker: BrokerProcess, tmp_path: Path) -> None:
    (block,) = sh_blocks("## Everyday commands")
    out = run(block, broker, tmp_path).stdout
    assert "k1:hello\tsource=cli" in out


def test_tiered_storage(broker: BrokerProcess, tmp_path: Path) -> None:
    (block,) = sh_blocks("### Tiered storage")
    out = run(block, broker, tmp_path).stdout
    assert "RemoteLogSizeBytes" in out
