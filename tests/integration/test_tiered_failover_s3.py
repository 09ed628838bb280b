"""A tiered topic on S3 (moto's server) across three broker processes over a real ZooKeeper:
kill -9 of the partition leader while it has segments to copy, several times, during an
idempotent acks=all produce; each killed broker restarts and rejoins the ISR.

Afterwards:
- every acknowledged record is read from offset 0 exactly once and in order, by
  confluent-kafka through the brokers and by the broker-free `TieredConsumer` (the object
  store for the remote part, the brokers for the tail);
- no segment survives twice in the bucket (no two manifests of the same offsets, none
  wholly inside another) and offsets overlap only where a new leader's segment began
  below what its predecessor had copied;
- no segment object without a manifest outlives the stuck-copy timeout;
- the manifests cover the remote tier from offset 0 without a gap;
- the leader's RemoteLogSizeBytes equals the sum of the segment sizes in the manifests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition
from confluent_kafka.admin import NewTopic

from tests.integration.moto_server import (
    CREDENTIALS,
    MotoServer,
    moto,  # noqa: F401 (a fixture)
)
from tests.integration.tiering_helpers import metric, metrics, status
from tests.integration.zk_cluster import (
    AcknowledgedProducer,
    ZooKeeperCluster,
    read_all,
    wait_for,
    zookeeper,  # noqa: F401 (a fixture)
)
from tests.zookeeper import ZooKeeperServer
from tierbroker.pipeline import TieredConsumer

# Kills leaders while copies are under way: the rates it relies on hold on an idle machine.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

TOPIC = "tiered-failover"
BUCKET = "tiered-failover"
MESSAGES = 30_000
PADDING = 400  # about 260 KB/s: a segment rolls about every second
SEGMENT_BYTES = 256 * 1024
COPY_BYTES_PER_SECOND = 384 * 1024
KILLS = 4
STUCK_COPY_TIMEOUT_MS = 3000
OBJECT = re.compile(r"/(\d{20})-([A-Za-z0-9_-]+)\.(log|indexes|manifest\.json)$")


def start_tiered_cluster(
    zk: ZooKeeperServer,
    s3: MotoServer,
    directory: Path,
    brokers: int = 3,
    overrides: dict[str, str] | None = None,
) -> ZooKeeperCluster:
    """`brokers` broker processes tiering to BUCKET on moto's server, started."""
    s3.create_bucket(BUCKET)
    tiered = {
        **s3.rsm_overrides(BUCKET),
        "remote.log.storage.system.enable": "true",
        "remote.log.manager.task.interval.ms": "200",
        # Above the produce rate, but each copy waits a while, COPY_SEGMENT_STARTED recorded:
        # a kill while the leader has a segment to copy often catches one in flight.
        "remote.log.manager.copy.max.bytes.per.second": str(COPY_BYTES_PER_SECOND),
        "remote.log.manager.stuck.copy.timeout.ms": str(STUCK_COPY_TIMEOUT_MS),
        "log.retention.check.interval.ms": "200",
    }
    cluster = ZooKeeperCluster(zk, directory, brokers, {**tiered, **(overrides or {})})
    return cluster.start()


@pytest.fixture
def cluster(
    zookeeper: ZooKeeperServer,  # noqa: F811 (the fixture)
    moto: MotoServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> Iterator[ZooKeeperCluster]:
    running = start_tiered_cluster(zookeeper, moto, tmp_path)
    yield running
    running.stop()


@dataclass(frozen=True)
class Manifest:
    key: str
    start: int
    end: int
    size: int
    broker: int


@dataclass
class Bucket:
    """The topic's objects in the bucket: the manifests, and the segment objects without one."""

    manifests: list[Manifest]
    orphans: list[str]

    @staticmethod
    def of(server: MotoServer) -> Bucket:
        client = server.client()
        keys = [
            o["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
            for o in page.get("Contents", [])
            if f"/{TOPIC}-" in o["Key"] and not o["Key"].endswith("/partition.json")
        ]
        by_segment: dict[str, list[str]] = defaultdict(list)
        for key in keys:
            match = OBJECT.search("/" + key)
            assert match, f"unexpected object {key}"
            by_segment[match.group(2)].append(key)
        manifests, orphans = [], []
        for objects in by_segment.values():
            manifest = [k for k in objects if k.endswith(".manifest.json")]
            if not manifest:
                orphans += objects
                continue
            segment = json.loads(client.get_object(Bucket=BUCKET, Key=manifest[0])["Body"].read())
            segment = segment["segment"]
            manifests.append(
                Manifest(
                    manifest[0],
                    segment["start_offset"],
                    segment["end_offset"],
                    segment["segment_size_bytes"],
                    segment["broker_id"],
                )
            )
        return Bucket(sorted(manifests, key=lambda m: (m.start, m.end)), sorted(orphans))

    def duplicates(self) -> list[tuple[Manifest, Manifest]]:
        """Pairs of manifests one of which lies wholly inside the other (the same offsets
        uploaded twice, both kept)."""
        return [
            (a, b)
            for i, a in enumerate(self.manifests)
            for b in self.manifests[i + 1 :]
            if (a.start <= b.start and b.end <= a.end) or (b.start <= a.start and a.end <= b.end)
        ]

    def gaps(self) -> list[tuple[int, int]]:
        """Offset ranges the manifests skip, from offset 0 to their highest end."""
        found, covered = [], -1
        for m in self.manifests:
            if m.start > covered + 1:
                found.append((covered + 1, m.start - 1))
            covered = max(covered, m.end)
        return found


def copying(cluster: ZooKeeperCluster, leader: int) -> bool:
    """True while the leader has rolled segments not yet in the remote tier."""
    return int(status(cluster.brokers[leader], TOPIC).get("copy_lag_segments", 0)) > 0


def remote_log_size(cluster: ZooKeeperCluster, leader: int) -> float | None:
    text = metrics(cluster.brokers[leader])
    return metric(text, "RemoteLogSizeBytes", topic=TOPIC, partition="0")


async def read_tiered(
    cluster: ZooKeeperCluster, endpoint: str, count: int
) -> tuple[list[int], int]:
    """Read partition 0 from offset 0 with `TieredConsumer` (REMOTE_PREFERRED): the sequence
    numbers, and how many records came from the object store."""
    tp = TopicPartition(TOPIC, 0)
    consumer = TieredConsumer(
        mode="REMOTE_PREFERRED",
        storage=f"s3://{BUCKET}/?endpoint={endpoint}&path_style=true",
        storage_options={
            "storage.aws.access.key.id": CREDENTIALS["aws_access_key_id"],
            "storage.aws.secret.access.key": CREDENTIALS["aws_secret_access_key"],
        },
        bootstrap_servers=cluster.bootstrap,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        values: list[int] = []
        deadline = time.monotonic() + 120
        while len(values) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500, max_records=5000)).values():
                values.extend(int(r.value) for r in records)
        return values, consumer.stats.remote_records.get(tp, 0)
    finally:
        await consumer.stop()


def test_killing_leaders_mid_copy_loses_nothing_and_uploads_nothing_twice(
    cluster: ZooKeeperCluster,
    moto: MotoServer,  # noqa: F811 (the fixture)
) -> None:
    config = {
        "min.insync.replicas": "2",
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(2 * SEGMENT_BYTES),
    }
    admin = cluster.admin()
    admin.create_topics([NewTopic(TOPIC, 1, 3, config=config)])[TOPIC].result(30)
    wait_for(lambda: sorted(cluster.partition_state(TOPIC, 0)[1]) == [0, 1, 2], "ISR")
    producer = AcknowledgedProducer(cluster.bootstrap, TOPIC, MESSAGES, PADDING)
    producer.start()
    victims = []
    for round_ in range(KILLS):
        wait_for(lambda r=round_: producer.sent > (r + 1) * MESSAGES // (KILLS + 2), "progress")
        leader, _ = cluster.partition_state(TOPIC, 0)
        wait_for(lambda v=leader: copying(cluster, v), f"broker {leader} to have a copy due")
        acknowledged = len(producer.acknowledged)
        cluster.brokers[leader].stop(signal.SIGKILL)
        victims.append(leader)
        wait_for(
            lambda a=acknowledged: len(producer.acknowledged) > min(a + 100, MESSAGES - 1),
            f"acks after killing {leader} (sent {producer.sent}, failed {producer.failed[:3]})",
        )
        cluster.restart(leader)
        wait_for(lambda: sorted(cluster.partition_state(TOPIC, 0)[1]) == [0, 1, 2], "ISR")
    producer.join(120)
    assert not producer.is_alive() and producer.failed == []
    assert sorted(producer.acknowledged) == list(range(MESSAGES))
    assert len(set(victims)) > 1

    def settled() -> bool:
        """Every rolled segment copied, abandoned copies removed, the size metric current."""
        leader, _ = cluster.partition_state(TOPIC, 0)
        bucket = Bucket.of(moto)
        return (
            not copying(cluster, leader)
            and not bucket.orphans
            and not bucket.duplicates()
            and remote_log_size(cluster, leader) == sum(m.size for m in bucket.manifests)
        )

    # Within the stuck-copy timeout and a few task intervals; what is left is reported below.
    with contextlib.suppress(AssertionError):
        wait_for(settled, "the remote tier", timeout_s=30 + STUCK_COPY_TIMEOUT_MS / 1000)
    leader, _ = cluster.partition_state(TOPIC, 0)
    bucket = Bucket.of(moto)
    assert bucket.orphans == []
    assert bucket.duplicates() == []
    assert bucket.gaps() == [] and bucket.manifests[0].start == 0
    # Offsets overlap only across a change of leader: the new leader's segment began below
    # what its predecessor had copied (replicas roll their segments independently).
    for a, b in zip(bucket.manifests, bucket.manifests[1:], strict=False):
        assert b.start > a.end or a.broker != b.broker, (a, b)
    assert remote_log_size(cluster, leader) == sum(m.size for m in bucket.manifests)
    remote_end = max(m.end for m in bucket.manifests)
    assert remote_end > MESSAGES // 2  # most of the log is remote

    assert read_all(cluster.bootstrap, TOPIC, MESSAGES) == list(range(MESSAGES))
    values, from_store = asyncio.run(read_tiered(cluster, moto.endpoint, MESSAGES))
    assert values == list(range(MESSAGES))
    assert from_store == remote_end + 1
