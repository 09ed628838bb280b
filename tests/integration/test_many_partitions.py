"""10,000 partitions under a file limit of 1,024: created in one CreateTopics while the
broker keeps answering others, written and read back with confluent-kafka, read again
after a restart under the same limit; 10,001 are refused as Kafka refuses them."""

from __future__ import annotations

import datetime
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from kio.index import load_payload_module
from kio.static.constants import EntityType

from tests.integration.broker_process import BrokerProcess, api_versions_answered
from tests.integration.wire import WireClient
from tierbroker.protocol.errors import ErrorCode

FILE_LIMIT = 1024
PARTITIONS = 10_000
TOPIC = "many"
WRITTEN = range(0, PARTITIONS, 4)  # 2,500 partitions written: more files than the limit
SAMPLE = [0, 4, 1020, 1024, 4444, 5000, 9996]
AFTER_RESTART = [0, 4444]  # written again after the restart


def create_topics(client: WireClient, name: str, partitions: int) -> Any:
    m = load_payload_module(19, 7, EntityType.request)
    request = m.CreateTopicsRequest(
        topics=(
            m.CreatableTopic(
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=120),
    )
    (topic,) = client.request(request).topics
    return topic


def value_of(p: int, round_: int) -> bytes:
    return b"partition %d round %d" % (p, round_)


def produce(bootstrap: str, partitions: range | list[int], round_: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for p in partitions:
        producer.produce(TOPIC, value_of(p, round_), partition=p)
        producer.poll(0)
    assert producer.flush(120) == 0


def consume(bootstrap: str, partitions: list[int]) -> dict[int, list[bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in partitions])
    got: dict[int, list[bytes]] = {p: [] for p in partitions}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if all(got.values()) and consumer.poll(1.0) is None:
                    break
                continue
            assert message.error() is None, message.error()
            got[message.partition()].append(message.value())
    finally:
        consumer.close()
    return got


@pytest.mark.slow
def test_ten_thousand_partitions_under_a_low_file_limit(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path, file_limit=FILE_LIMIT).start()
    outcome: dict[str, Any] = {}

    def create() -> None:
        with WireClient(broker.port, timeout_s=300) as client:
            outcome["topic"] = create_topics(client, TOPIC, PARTITIONS)
            outcome["answered_at"] = time.monotonic()

    creating = threading.Thread(target=create)
    sent_at = time.monotonic()
    creating.start()
    probes: list[tuple[float, float]] = []  # (sent, answered) of ApiVersions on new connections
    while creating.is_alive():
        probe_sent = time.monotonic()
        assert api_versions_answered(broker.port, timeout_s=60)
        probes.append((probe_sent, time.monotonic()))
        time.sleep(0.05)
    creating.join()

    topic = outcome["topic"]
    assert topic.error_code == ErrorCode.none, topic
    assert topic.num_partitions == PARTITIONS
    in_flight = [p for p in probes if p[0] > sent_at and p[1] < outcome["answered_at"]]
    assert in_flight, "no ApiVersions was answered while the CreateTopics was in flight"
    worst_ms = max(answered - sent for sent, answered in in_flight) * 1000
    print(f"{len(in_flight)} probes answered during CreateTopics, slowest {worst_ms:.0f} ms")

    with WireClient(broker.port, timeout_s=60) as client:
        refused = create_topics(client, "too-many", PARTITIONS + 1)
    assert refused.error_code == ErrorCode.policy_violation
    assert refused.error_message == "Unable to perform excessively large batch operation."
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    growth = admin.create_partitions([NewPartitions(TOPIC, 2 * PARTITIONS + 1)])[TOPIC]
    with pytest.raises(KafkaException) as refused_growth:  # 10,001 new partitions
        growth.result(60)
    assert refused_growth.value.args[0].code() == ErrorCode.policy_violation

    produce(broker.bootstrap, WRITTEN, 1)
    assert consume(broker.bootstrap, SAMPLE) == {p: [value_of(p, 1)] for p in SAMPLE}

    broker.stop(signal.SIGKILL)  # a clean shutdown fsyncs 10,000 producer snapshots
    broker = broker.restarted(timeout_s=120)
    produce(broker.bootstrap, AFTER_RESTART, 2)
    got = consume(broker.bootstrap, SAMPLE)
    for p in SAMPLE:
        assert got[p] == [value_of(p, 1)] + ([value_of(p, 2)] if p in AFTER_RESTART else []), p
    broker.stop(signal.SIGKILL)
    assert "Too many open files" not in broker.log()
    assert "Traceback" not in broker.log()
