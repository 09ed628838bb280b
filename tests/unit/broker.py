"""One broker in this test's event loop, on a free port, with its in-process metadata store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tierbroker.broker.config.broker_config import load_config
from tierbroker.broker.server.broker_server import BrokerServer
from tierbroker.broker.server.cluster_runner import ClusterRunner


@asynccontextmanager
async def running_broker(tmp_path: Path, *overrides: str) -> AsyncIterator[BrokerServer]:
    config = load_config(
        None,
        [
            f"log.dirs={tmp_path / 'logs'}",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "metrics.port=0",
            *overrides,
        ],
    )
    runner = ClusterRunner(config)
    await runner.start()
    try:
        yield runner.brokers[0]
    finally:
        await runner.stop()
