"""SIGTERM while ZooKeeper is unreachable: the controlled shutdown cannot be asked for, so
the broker shuts down uncontrolled within `shutdown.timeout.ms` (logs flushed), exits
non-zero with one `error:` line saying why, and loses nothing it acknowledged.

Two broker processes over a ZooKeeper of this test's own (it is stopped and started);
then a lone broker, which has no leadership to hand over but cannot resign as
controller, is bounded the same way.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.zk_cluster import ZooKeeperCluster
from tests.zookeeper import ZooKeeperServer

# Stops and starts ZooKeeper under acks=all produce: run with nothing beside it.
pytestmark = pytest.mark.alone

SHUTDOWN_TIMEOUT_MS = 5000
RECORDS = 200


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path / "zk").start()
    yield server
    server.stop()


def test_a_controller_that_cannot_resign_exits_within_the_shutdown_timeout(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    """Nothing to hand over (one broker), but resigning as controller writes to ZooKeeper."""
    bounded = {"shutdown.timeout.ms": str(SHUTDOWN_TIMEOUT_MS)}
    cluster = ZooKeeperCluster(zookeeper, tmp_path / "one", brokers=1, overrides=bounded).start()
    broker = cluster.brokers[0]
    assert broker.process is not None
    try:
        zookeeper.stop()
        os.kill(broker.process.pid, signal.SIGTERM)
        code = broker.process.wait(SHUTDOWN_TIMEOUT_MS / 1000 + 10)
    finally:
        cluster.stop()
    errors = [line for line in broker.log().splitlines() if line.startswith("error: ")]
    assert code != 0 and len(errors) == 1, broker.log()[-3000:]
    assert "shutdown.timeout.ms" in errors[0] and "logs flushed" in errors[0], errors
