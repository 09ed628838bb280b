"""Tiering as Apache Kafka tiers: the same topic configs on tierbroker and on Kafka with its
own LocalTieredStorage move closed segments to the remote tier, delete them locally, answer
the tiered offsets (KIP-405, KIP-1005) alike, and serve every record from offset 0 again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.apache_kafka import ApacheKafka, tiered_storage
from tests.integration.tiering_helpers import (
    EARLIEST,
    EARLIEST_LOCAL,
    LATEST,
    LATEST_TIERED,
    list_offsets,
)
from tests.integration.waiting import wait_for
from tierbroker.testing import cluster_fixture
from tierbroker.testing.clients import produce, read

RECORDS = 5_000
# Kafka 4's smallest segment.bytes: about 1,000 records of 1 KiB per segment.
TOPIC_CONFIG = {
    "remote.storage.enable": "true",
    "segment.bytes": "1048576",
    "local.retention.bytes": "1",
}

tiered_tierbroker = cluster_fixture("module", tiering=True)


@pytest.fixture(scope="module")
def tiered_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    directory = tmp_path_factory.mktemp("tiered-kafka")
    kafka = ApacheKafka(directory / "kafka", tiered_storage(directory)).start()
    yield kafka
    kafka.stop()


@pytest.fixture(params=["tierbroker", "apache-kafka"])
def tiered_broker(request: pytest.FixtureRequest) -> str:
    fixture = "tiered_tierbroker" if request.param == "tierbroker" else "tiered_kafka"
    return str(request.getfixturevalue(fixture).bootstrap_servers)


def test_closed_segments_move_to_the_remote_tier_and_read_back_from_zero(
    tiered_broker: str,
) -> None:
    topic = f"tiered-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tiered_broker})
    admin.create_topics([NewTopic(topic, 1, 1, config=TOPIC_CONFIG)])[topic].result(30)
    records = [(f"k{i}".encode(), i.to_bytes(4, "big") * 256) for i in range(RECORDS)]
    produce(tiered_broker, topic, records, partition=0)
    port = int(tiered_broker.rsplit(":", 1)[1])

    def offsets() -> dict[int, int]:
        answers = {
            t: list_offsets(port, topic, t, version=10)
            for t in (EARLIEST, LATEST, EARLIEST_LOCAL, LATEST_TIERED)
        }
        assert all(answer[0] == 0 for answer in answers.values()), answers
        return {t: answer[1] for t, answer in answers.items()}

    # Tiered and deleted locally: the local log starts just past the highest tiered offset.
    tiered = wait_for(
        lambda: (
            (o := offsets())[EARLIEST_LOCAL] > 0 and o[LATEST_TIERED] + 1 == o[EARLIEST_LOCAL] and o
        ),
        "closed segments tiered and deleted locally",
        timeout_s=90,
        show=offsets,
    )
    assert tiered[EARLIEST] == 0
    assert tiered[LATEST] == RECORDS
    assert 0 < tiered[EARLIEST_LOCAL] < RECORDS

    got = read(tiered_broker, topic, 0, 0, RECORDS, timeout_s=60)
    assert [(r.offset, r.key, r.value) for r in got] == [
        (offset, key, value) for offset, (key, value) in enumerate(records)
    ]
