"""`__consumer_offsets` is compacted, as in Kafka: a million offset commits by 100
groups leave it within a small multiple of its live keys on disk, and after a restart
each partition's load replays about one record a live key, then every group finds
its last commits."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from tests.integration.broker_process import BrokerProcess
from tests.integration.waiting import wait_for
from tierbroker.broker.coordinator.group.records import partition_for

pytestmark = pytest.mark.slow

GROUPS, PARTITIONS, ROUNDS = 100, 100, 100  # 100 x 100 x 100 = 1,000,000 commits
OFFSETS_PARTITIONS = 5
SEGMENT_BYTES = 256 << 10
RECORD_BYTES = 40  # an offset commit's record, at the least (offset key and value)
BROKER = {
    "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
    "offsets.topic.replication.factor": "1",
    "offsets.topic.segment.bytes": str(SEGMENT_BYTES),
    "log.cleaner.backoff.ms": "100",
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path, BROKER).start()
    yield process
    process.kill()


def commit_rounds(bootstrap: str) -> None:
    """Each group commits an offset for every partition of `t`, ROUNDS times."""
    consumers = [
        Consumer({"bootstrap.servers": bootstrap, "group.id": f"group-{g}"}) for g in range(GROUPS)
    ]
    try:
        for round_ in range(ROUNDS):
            for consumer in consumers:
                offsets = [TopicPartition("t", p, round_ + 1) for p in range(PARTITIONS)]
                consumer.commit(offsets=offsets, asynchronous=round_ < ROUNDS - 1)
    finally:
        for consumer in consumers:
            consumer.close()


def offsets_bytes(data_dir: Path) -> int:
    return sum(f.stat().st_size for f in (data_dir / "logs").glob("__consumer_offsets-*/*.log"))


def all_clean(data_dir: Path) -> bool:
    """Every partition's cleaner checkpoint at its active segment: all rolled ones clean."""
    checkpoint = data_dir / "logs" / "cleaner-offset-checkpoint"
    if not checkpoint.exists():
        return False
    cleaned = {
        int(line.split()[1]): int(line.split()[2])
        for line in checkpoint.read_text().splitlines()[2:]
        if line.startswith("__consumer_offsets ")
    }
    for p in range(OFFSETS_PARTITIONS):
        segments = sorted((data_dir / "logs" / f"__consumer_offsets-{p}").glob("*.log"))
        if len(segments) > 1 and cleaned.get(p) != int(segments[-1].name[:20]):
            return False
    return True


def test_a_million_commits_stay_bounded_and_load_fast(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("t", PARTITIONS, 1)])["t"].result(15)
    commit_rounds(broker.bootstrap)
    resource = ConfigResource(ResourceType.TOPIC, "__consumer_offsets")
    configs = admin.describe_configs([resource])[resource].result(15)
    assert configs["cleanup.policy"].value == "compact"
    live = Counter(partition_for(f"group-{g}", OFFSETS_PARTITIONS) for g in range(GROUPS))
    wait_for(lambda: all_clean(tmp_path), "every rolled segment of the topic cleaned")
    # Rolled segments hold one record a live key; the active ones hold the rest.
    live_bytes = GROUPS * PARTITIONS * RECORD_BYTES
    assert offsets_bytes(tmp_path) <= 2 * live_bytes + OFFSETS_PARTITIONS * SEGMENT_BYTES
    broker.stop()
    restarted = broker.restarted()
    try:
        consumer = Consumer({"bootstrap.servers": restarted.bootstrap, "group.id": "group-42"})
        committed = consumer.committed([TopicPartition("t", p) for p in range(PARTITIONS)], 30)
        consumer.close()
        assert [tp.offset for tp in committed] == [ROUNDS] * PARTITIONS
        loads = dict(
            (int(p), int(n))
            for p, n in re.findall(
                r"loaded __consumer_offsets-(\d+): (\d+) records", restarted.log()
            )
        )
        assert set(loads) == set(range(OFFSETS_PARTITIONS))
        for p, replayed in loads.items():
            # About one record a live key, and what the active segment holds beside them.
            assert replayed <= live[p] * PARTITIONS + SEGMENT_BYTES // RECORD_BYTES, p
    finally:
        restarted.kill()
