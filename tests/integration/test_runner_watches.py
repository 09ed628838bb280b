"""`ClusterRunner` watches the broker running under each id: one restarted by
`start_broker` that must stop (every log dir failed) stops the process, as at first."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tierbroker.broker.server.embedded import EmbeddedCluster


def test_a_restarted_broker_that_must_stop_stops_the_process(tmp_path: Path) -> None:
    with EmbeddedCluster(tmp_path, brokers=2) as cluster:
        cluster.stop_broker(1)
        cluster.start_broker(1)
        runner = cluster.runner
        assert runner is not None

        async def fail_and_wait() -> str | None:
            broker = runner.broker(1)
            broker.fatal_error = "every log dir is offline"
            broker.stop_requested.set()
            await asyncio.wait_for(runner.stop_requested.wait(), 10)
            return runner.fatal_error

        assert cluster.call(fail_and_wait()) == "every log dir is offline"
