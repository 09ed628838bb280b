"""Compaction on three replicas: each cleans its own copy, as in Kafka, and all three
end with the same records. A follower that was down while its leader cleaned copies
the leader's log with its gaps, and then cleans as the others do."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.integration.test_compaction import (
    COMPACTED,
    HORIZON_MS,
    kcat_rows,
    produce_rounds,
    roll,
)
from tierbroker.protocol.records import decode_records
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.testing import TierbrokerCluster

TOPIC = "replicated"
TP = TopicPartition(TOPIC, 0)
Rows = list[tuple[int, bytes | None, bytes | None]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TierbrokerCluster]:
    with TierbrokerCluster(
        tmp_path_factory.mktemp("compaction-replicas"),
        3,
        broker_config={"log.cleaner.backoff.ms": 100},
    ) as c:
        yield c


def replica_rows(cluster: TierbrokerCluster) -> dict[int, Rows]:
    """Each running replica's records, read from its segment files on its event loop."""

    def read() -> dict[int, Rows]:
        found = {}
        for server in cluster.embedded.brokers:
            lg = server.log_manager.logs.get(TP) if server.running else None
            if lg is not None:
                data = b"".join(s.log_path.read_bytes() for s in lg.segments)
                found[server.broker_id] = [(r.offset, r.key, r.value) for r in decode_records(data)]
        return found

    return cluster.embedded.read(read)


def test_replicas_clean_on_their_own_and_end_alike(cluster: TierbrokerCluster) -> None:
    cluster.create_topic(TOPIC, 1, 3, COMPACTED)
    follower = next(b for b in (0, 1, 2) if b != cluster.leader(TOPIC))
    cluster.stop_broker(follower)
    bootstrap = cluster.bootstrap_servers
    expected = produce_rounds(bootstrap, TOPIC)
    roll(bootstrap, TOPIC, 1)
    cluster.wait_for(lambda: len(kcat_rows(bootstrap, TOPIC)) == len(expected) + 1, "a clean")
    # The follower catches up from the cleaned leader: its log has the leader's gaps.
    cluster.start_broker(follower)
    cluster.wait_for(lambda: follower in cluster.isr(TOPIC), "the follower back in the ISR")

    time.sleep(HORIZON_MS / 1000)
    roll(bootstrap, TOPIC, 2)
    live = {key.encode(): value.encode() for key, value in expected.items() if value is not None}
    wanted = {**live, b"roll": b"2"}

    def converged() -> bool:
        rows = replica_rows(cluster)
        return len(rows) == 3 and all(
            {k: v for _, k, v in r} == wanted and len(r) == len(live) + 2 for r in rows.values()
        )

    cluster.wait_for(converged, "three replicas with the same last values", timeout_s=60)
    rows = replica_rows(cluster)
    assert rows[0] == rows[1] == rows[2]
