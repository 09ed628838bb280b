"""Partition reassignment: time and bytes moved, a tiered partition against an untiered one
of the same size, in one run.

Three brokers in one process share a LocalFs remote tier. Two topics of one partition
on broker 0 get the same `--mib` of incompressible 1 KiB records; the tiered one
(`remote.storage.enable`) copies its rolled segments and keeps `--local-mib` locally
(`local.retention.bytes`). Each is then moved to broker 1, which had no replica, with
AlterPartitionReassignments (kafka-python). Measured: seconds from the request to the
end of the move (the metadata shows the target, no replica being added), and the bytes
the new replica then holds locally, all of which it fetched from the leader (a tiered
replica rebuilds its log start from the remote tier and fetches only the leader's local
tail). Goal: bytes in proportion to the local tail, time at least 10x shorter.

    python -m benchmarks.reassignment                       # 128 MiB, 8 MiB local
    python -m benchmarks.reassignment --mib 512 --local-mib 16
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.topic_partition import TopicPartition

with warnings.catch_warnings():  # kafka-python's deprecated importlib.resources calls
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition

MIB = 1 << 20
VALUE_BYTES = 1024


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def fill(cluster: EmbeddedCluster, topic: str, mib: int, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    new = NewTopic(topic, 1, replica_assignment=[[0]], config=configs)
    admin.create_topics([new])[topic].result(30)
    wait_for(lambda: cluster.broker(0).cache.has_leaders(topic), f"{topic}'s leader")
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 256 * 1024,
            "compression.type": "none",
        }
    )
    value = os.urandom(VALUE_BYTES)
    for i in range(mib * MIB // VALUE_BYTES):
        while True:
            try:
                producer.produce(topic, value, key=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0


def local_bytes(cluster: EmbeddedCluster, broker: int, topic: str) -> int:
    return cluster.broker(broker).log_manager.logs[TopicPartition(topic, 0)].size_in_bytes


def settle_tiered(cluster: EmbeddedCluster, topic: str, local_retention: int) -> None:
    """Wait until every rolled segment is copied and local retention has done its work."""
    log = cluster.broker(0).log_manager.logs[TopicPartition(topic, 0)]

    def settled() -> bool:
        segments = log.segments
        return (
            log.highest_offset_in_remote_storage + 1 == segments[-1].base_offset
            and log.size_in_bytes - segments[0].size < local_retention
        )

    wait_for(settled, f"{topic} to be tiered")


def move(cluster: EmbeddedCluster, admin: KafkaAdminClient, topic: str) -> float:
    """Seconds to move partition 0 of `topic` from broker 0 to broker 1."""
    tp = TopicPartition(topic, 0)
    cache = cluster.broker(1).cache
    started = time.perf_counter()
    assert admin.alter_partition_reassignments({KpTopicPartition(topic, 0): [1]}) == {
        KpTopicPartition(topic, 0): None
    }

    def done() -> bool:
        assignment = cache.topics.get(topic)
        return (
            assignment is not None
            and cache.replicas(tp) == (1,)
            and not assignment.adding_replicas
            and tp in cluster.broker(1).log_manager.logs
        )

    wait_for(done, f"the move of {topic}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=128, help="MiB of records per topic")
    parser.add_argument("--local-mib", type=int, default=8, help="local.retention.bytes, MiB")
    args = parser.parse_args()
    segment = max(args.local_mib // 4, 1) * MIB
    workdir = Path(tempfile.mkdtemp(prefix="bench-reassign-"))
    cluster = EmbeddedCluster(
        workdir / "brokers",
        brokers=3,
        properties={
            "remote.log.storage.system.enable": "true",
            "rsm.config.dir": str(workdir / "remote"),
            "remote.log.manager.task.interval.ms": "200",
            "log.retention.check.interval.ms": "200",
            "replica.fetch.backoff.ms": "200",
            "auto.leader.rebalance.enable": "false",
        },
    ).start()
    try:
        sizes = {"segment.bytes": str(segment)}
        fill(cluster, "untiered", args.mib, sizes)
        tiered = {
            **sizes,
            "remote.storage.enable": "true",
            "local.retention.bytes": str(args.local_mib * MIB),
        }
        fill(cluster, "tiered", args.mib, tiered)
        settle_tiered(cluster, "tiered", args.local_mib * MIB)
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        rows = {}
        for topic in ("untiered", "tiered"):
            held = local_bytes(cluster, 0, topic)
            seconds = move(cluster, admin, topic)
            rows[topic] = (held, seconds, local_bytes(cluster, 1, topic))
        admin.close()
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.mib} MiB per topic; the tiered one keeps {args.local_mib} MiB locally")
    print("{:>9} {:>20} {:>10} {:>16}".format("topic", "leader local MiB", "move s", "MiB moved"))
    for topic, (held, seconds, moved) in rows.items():
        print(f"{topic:>9} {held / MIB:>20.1f} {seconds:>10.2f} {moved / MIB:>16.1f}")
    (_, untiered_s, untiered_b), (_, tiered_s, tiered_b) = rows["untiered"], rows["tiered"]
    print(
        f"tiered vs untiered: {untiered_s / tiered_s:.1f}x shorter, "
        f"{untiered_b / tiered_b:.1f}x fewer bytes moved"
    )


if __name__ == "__main__":
    main()
