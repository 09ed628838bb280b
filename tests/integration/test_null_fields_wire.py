"""A request with a null where Kafka's schema forbids one closes its connection before any
handler runs, with a log line; the broker keeps serving."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.integration.broker_process import BrokerProcess, api_versions_answered
from tests.integration.wire import WireClient


def test_a_null_topics_array_closes_the_connection_and_nothing_else(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path).start()
    # OffsetCommit v2: group "g", generation 1, member "m", retention -1, topics null.
    body = (
        struct.pack(">h", 1) + b"g" + struct.pack(">ih", 1, 1) + b"m" + struct.pack(">qi", -1, -1)
    )
    with WireClient(broker.port) as client:
        client.send_frame(struct.pack(">hhih", 8, 2, 1, 4) + b"test" + body)
        assert client.is_closed(timeout_s=10)
    assert api_versions_answered(broker.port, timeout_s=10)
    assert broker.stop() == 0
    log = broker.log()
    assert "null in non-nullable array OffsetCommitRequest.topics" in log, log
    assert "Traceback" not in log, log
