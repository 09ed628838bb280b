"""A tiered partition whose replicas are on brokers hosting no replica of
`__remote_log_metadata` (4 and 5 brokers in one process, the metadata topic of one
partition with replication factor 1): its brokers read the metadata from the metadata
partition's leader over the wire.

The partition's leader tiers most of its log; it is killed, and its follower, which must
learn from the metadata what is remote, leads. Then:
- each segment is committed once, and a copy the kill left unrecorded is removed;
- the killed broker, its disk emptied, rebuilds from the remote tier, fetching only what
  the leader has not tiered yet (KIP-1023);
- every acknowledged record is read from offset 0 by confluent-kafka.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.test_follower_fetching import consume_confluent, log_of, sequence
from tests.integration.test_replica_rebuild import metric, produce, tiered_properties
from tests.integration.tiering_helpers import check_rebuilt_from_the_tail
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.log import Log
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentState, TopicIdPartition
from tierbroker.storage.topic_partition import TopicPartition

TOPIC = "rebuilt"  # the name `produce` and `metric` use
METADATA = TopicPartition("__remote_log_metadata", 0)
RECORDS = 8_000
SEGMENT_BYTES = 64 * 1024
LOCAL_RETENTION_BYTES = 3 * SEGMENT_BYTES
# A copy the killed leader finished in the remote tier but never recorded as finished is
# abandoned: its files stay until this has passed, then the expiration task removes them.
STUCK_COPY_TIMEOUT_MS = 3000


@pytest.fixture(params=[4, 5], ids=["4-brokers", "5-brokers"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(
        tmp_path / "brokers",
        brokers=request.param,
        properties={
            **tiered_properties(tmp_path / "remote"),
            "remote.log.manager.stuck.copy.timeout.ms": str(STUCK_COPY_TIMEOUT_MS),
            "remote.log.metadata.topic.num.partitions": "1",
            "remote.log.metadata.topic.replication.factor": "1",
        },
    ) as running:
        yield running


def uploads(root: Path) -> tuple[dict[int, list[str]], list[str]]:
    """The segments in the remote tier: segment ids by start offset, from their manifests,
    and the files of segments without a manifest (orphans)."""
    files: dict[str, list[Path]] = defaultdict(list)
    for path in root.rglob(f"{TOPIC}-*/0/*"):
        if path.name != "partition.json":  # the partition's index, not a segment's object
            files[path.name.split(".", 1)[0]].append(path)
    by_start: dict[int, list[str]] = defaultdict(list)
    orphans = []
    for name, paths in files.items():
        manifest = [p for p in paths if p.name.endswith(".manifest.json")]
        if not manifest:
            orphans += [p.name for p in paths]
            continue
        segment = json.loads(manifest[0].read_text())["segment"]
        by_start[segment["start_offset"]].append(name)
    return by_start, sorted(orphans)


def test_leaders_without_a_metadata_replica_tier_once_and_followers_rebuild_from_remote(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    brokers = [b.config.broker_id for b in cluster.brokers]
    wait_for(lambda: cluster.brokers[0].cache.leader(METADATA) in brokers, "the metadata topic")
    hosts = set(cluster.brokers[0].cache.replicas(METADATA))
    first, second = [b for b in brokers if b not in hosts][:2]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(LOCAL_RETENTION_BYTES),
    }
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[first, second]], config=config)
    admin.create_topics([topic])[TOPIC].result(30)
    tp = TopicPartition(TOPIC, 0)
    wait_for(
        lambda: (
            set(cluster.brokers[0].cache.states[tp].isr) == {first, second}
            if tp in cluster.brokers[0].cache.states
            else False
        ),
        "both replicas in the ISR",
    )
    produced_bytes = produce(cluster, RECORDS)
    leader_log = log_of(cluster, first, TOPIC)
    wait_for(
        lambda: leader_log.highest_offset_in_remote_storage > RECORDS // 2,
        "the leader to tier most of its log",
        show=lambda: leader_log.highest_offset_in_remote_storage,
    )
    follower_log = log_of(cluster, second, TOPIC)
    # Its follower learns what is remote from the metadata it reads from another broker.
    wait_for(
        lambda: follower_log.highest_offset_in_remote_storage > RECORDS // 2,
        "the follower to learn the remote tier",
        show=lambda: follower_log.highest_offset_in_remote_storage,
    )

    cluster.kill_broker(first)
    wait_for(lambda: cluster.broker(second).cache.leader(tp) == second, "the follower to lead")
    new_log: Log = log_of(cluster, second, TOPIC)

    def settled() -> bool:
        """The new leader copied every rolled segment and kept only its local tail."""
        segments = new_log.segments
        return (
            new_log.highest_offset_in_remote_storage + 1 == segments[-1].base_offset
            and new_log.size_in_bytes - segments[0].size < LOCAL_RETENTION_BYTES
        )

    wait_for(settled, "the new leader to tier its log", show=lambda: new_log.segments)
    # Each segment is committed once: what the new leader's metadata records as copied.
    remote = cluster.broker(second).remote
    assert remote is not None
    tip = TopicIdPartition(new_log.topic_id, tp)
    finished = Counter(
        s.start_offset
        for s in remote.rlmm.list_remote_log_segments(tip)
        if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
    )
    assert [start for start, copies in finished.items() if copies > 1] == []

    def cleaned() -> bool:
        by_start, orphans = uploads(tmp_path / "remote")
        return orphans == [] and all(len(ids) == 1 for ids in by_start.values())

    wait_for(cleaned, "abandoned copies removed", show=lambda: uploads(tmp_path / "remote"))

    log_dir = cluster.broker(first).config.log_dir_paths[0]
    shutil.rmtree(log_dir)  # an emptied disk: its logs, checkpoints and remote metadata
    log_dir.mkdir()
    cluster.start_broker(first)
    wait_for(
        lambda: set(cluster.broker(second).replicas.partitions[tp].isr) == {first, second},
        "the rebuilt follower back in the ISR",
    )
    rebuilt = log_of(cluster, first, TOPIC)
    # It starts after the leader's last tiered offset, past local segments tiered already.
    start = new_log.highest_offset_in_remote_storage + 1
    assert rebuilt.segments[0].base_offset == start > new_log.local_log_start_offset > 0
    check_rebuilt_from_the_tail(lambda name: metric(cluster, first, name), produced_bytes)

    values, _ = consume_confluent(cluster, TOPIC, RECORDS, None)
    assert sequence(values) == list(range(RECORDS))
