"""What fetching from the closest replica (KIP-392) saves and costs.

One `tierbroker serve --brokers 3 --racks a,b,c` with Kafka's RackAwareReplicaSelector,
confluent-kafka clients in this process:

- cross-rack bytes: three consumers, one per rack, each read a 3-partition topic whole
  (leaders spread over the racks), without and then with `client.rack`; bytes served by a
  broker of another rack than the consumer's, from the brokers' `ConsumerBytesOut`
  (goal: from about two thirds of all bytes to none);
- latency: one acks=all record every 10 ms to a 1-partition topic, read by a consumer on
  the leader (no rack) and one on a follower (its rack) at once; produce-to-consume p50
  and p99 of each (goal: the follower's p50 within 10 ms of the leader's);
- throughput: a prefilled 1-partition topic read whole from the leader and from a
  follower, rounds alternating (goal: follower >= 0.9x the leader).

    python -m benchmarks.follower_fetching                 # about a minute on 2 cores
    python -m benchmarks.follower_fetching --mib 128 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.targets import ROOT, api_versions_answered, tierbroker_command

RACKS = ["a", "b", "c"]
SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
VALUE = b"v" * 1024


@dataclass(frozen=True)
class Broker:
    broker_id: int
    port: int
    metrics_port: int

    @property
    def rack(self) -> str:
        return RACKS[self.broker_id]


@contextmanager
def cluster() -> Iterator[list[Broker]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-kip392-"))
    ports_file = workdir / "ports.json"
    command = [tierbroker_command(), "serve", "--brokers", "3", "--racks", ",".join(RACKS)]
    command += ["--ports-file", str(ports_file)]
    for setting in (
        "listeners=PLAINTEXT://127.0.0.1:0",
        "metrics.port=0",
        f"log.dirs={workdir / 'data'}",
        f"replica.selector.class={SELECTOR}",
        "remote.log.storage.system.enable=false",
    ):
        command += ["--override", setting]
    log = open(workdir / "broker.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not ports_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tierbroker did not start; see {workdir / 'broker.log'}")
            time.sleep(0.05)
        brokers = [
            Broker(b["broker_id"], b["port"], b["metrics_port"])
            for b in json.loads(ports_file.read_text())
        ]
        assert all(api_versions_answered(b.port) for b in brokers)
        yield brokers
    finally:
        process.terminate()
        process.wait(60)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def bootstrap(brokers: list[Broker]) -> str:
    return ",".join(f"127.0.0.1:{b.port}" for b in brokers)


def served_bytes(broker: Broker, topic: str) -> float:
    """`ConsumerBytesOut` of the broker for the topic, all partitions and localities."""
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ConsumerBytesOut_total{") and f'topic="{topic}"' in line
    )


def create_topic(brokers: list[Broker], topic: str, partitions: int) -> list[int]:
    """The leader of each partition, once every replica is in the ISR."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:
        found = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if len(found) == partitions and all(len(p.isrs) == 3 for p in found.values()):
            return [found[p].leader for p in range(partitions)]
        assert time.monotonic() < deadline, "the topic's replicas did not join the ISR"
        time.sleep(0.1)


def fill(brokers: list[Broker], topic: str, mib: int, partitions: int) -> int:
    producer = Producer({"bootstrap.servers": bootstrap(brokers), "acks": "all", "linger.ms": 20})
    count = mib * 1024
    for i in range(count):
        while True:
            try:
                producer.produce(topic, VALUE, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    return count


def read_whole(
    brokers: list[Broker], topic: str, partitions: int, count: int, rack: str | None
) -> float:
    """Seconds to read `count` records of the topic from the start."""
    config = {
        "bootstrap.servers": bootstrap(brokers),
        "group.id": f"bench-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "fetch.max.bytes": 50 * 1024 * 1024,
        "max.partition.fetch.bytes": 10 * 1024 * 1024,
    }
    if rack is not None:
        config["client.rack"] = rack
    consumer = Consumer(config)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    read = 0
    started = time.perf_counter()
    deadline = time.monotonic() + 300
    while read < count:
        assert time.monotonic() < deadline, f"read {read} of {count}"
        read += sum(1 for m in consumer.consume(10_000, 0.5) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def cross_rack(brokers: list[Broker], mib: int) -> tuple[float, float]:
    """The fraction of consumer bytes that crossed racks, without and with client.rack."""
    fractions = []
    for with_rack in (False, True):
        topic = f"racks-{int(with_rack)}"
        create_topic(brokers, topic, 3)
        count = fill(brokers, topic, mib, 3)
        crossed = total = 0.0
        for consumer_rack in RACKS:
            before = {b.broker_id: served_bytes(b, topic) for b in brokers}
            read_whole(brokers, topic, 3, count, consumer_rack if with_rack else None)
            for b in brokers:
                served = served_bytes(b, topic) - before[b.broker_id]
                total += served
                crossed += served if b.rack != consumer_rack else 0.0
        fractions.append(crossed / total)
    return fractions[0], fractions[1]


class LatencyReader(threading.Thread):
    """Receive time minus send time (ms) of every record, read from the topic's start."""

    def __init__(self, brokers: list[Broker], topic: str, rack: str | None) -> None:
        super().__init__(daemon=True)
        config = {
            "bootstrap.servers": bootstrap(brokers),
            "group.id": f"latency-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
        if rack is not None:
            config["client.rack"] = rack
        self.consumer = Consumer(config)
        self.consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.latencies_ms: list[float] = []
        self.running = True

    def run(self) -> None:
        while self.running:
            message = self.consumer.poll(0.1)  # one at a time: a batch would wait to fill
            if message is not None and message.error() is None:
                sent_ns = int(message.value())
                self.latencies_ms.append((time.time_ns() - sent_ns) / 1e6)
        self.consumer.close()


def latency(brokers: list[Broker], records: int) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of produce-to-consume on the leader and on a follower."""
    topic = "latency"
    [leader] = create_topic(brokers, topic, 1)
    follower = next(b for b in brokers if b.broker_id != leader)
    readers = {
        "leader": LatencyReader(brokers, topic, None),
        "follower": LatencyReader(brokers, topic, follower.rack),
    }
    for reader in readers.values():
        reader.start()
    producer = Producer({"bootstrap.servers": bootstrap(brokers), "acks": "all", "linger.ms": 5})
    producer.produce(topic, b"%d" % time.time_ns())  # the readers settle on their replicas
    producer.flush(10)
    time.sleep(2)
    for reader in readers.values():
        reader.latencies_ms.clear()
    for _ in range(records):
        producer.produce(topic, b"%d" % time.time_ns())
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(30)
    deadline = time.monotonic() + 30
    while any(len(r.latencies_ms) < records for r in readers.values()):
        assert time.monotonic() < deadline, "the readers did not get every record"
        time.sleep(0.1)
    result = {}
    for name, reader in readers.items():
        reader.running = False
        reader.join(10)
        cuts = statistics.quantiles(reader.latencies_ms, n=100)
        result[name] = (cuts[49], cuts[98])
    return result


def throughput(brokers: list[Broker], mib: int, repeat: int) -> list[tuple[float, float]]:
    """(leader MiB/s, follower MiB/s) per round, alternating which goes first."""
    topic = "throughput"
    [leader] = create_topic(brokers, topic, 1)
    follower = next(b for b in brokers if b.broker_id != leader)
    count = fill(brokers, topic, mib, 1)
    read_whole(brokers, topic, 1, count, None)  # warm: page cache, connections, code
    rounds = []
    for i in range(repeat):
        order = [None, follower.rack] if i % 2 == 0 else [follower.rack, None]
        seconds = {rack: read_whole(brokers, topic, 1, count, rack) for rack in order}
        rounds.append((mib / seconds[None], mib / seconds[follower.rack]))
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB read in each throughput round")
    parser.add_argument("--cross-rack-mib", type=int, default=16)
    parser.add_argument("--records", type=int, default=2000, help="latency records")
    parser.add_argument("--repeat", type=int, default=5, help="throughput rounds")
    args = parser.parse_args()
    with cluster() as brokers:
        without, with_rack = cross_rack(brokers, args.cross_rack_mib)
        print(f"cross-rack bytes: {without:.0%} without client.rack, {with_rack:.0%} with it")
        for name, (p50, p99) in latency(brokers, args.records).items():
            print(f"produce-to-consume on the {name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        rounds = throughput(brokers, args.mib, args.repeat)
        for leader_rate, follower_rate in rounds:
            print(f"  leader {leader_rate:7.1f} MiB/s   follower {follower_rate:7.1f} MiB/s")
        ratio = statistics.median(f / lead for lead, f in rounds)
        print(f"consume from a follower: {ratio:.2f}x the leader (median of {len(rounds)} rounds)")


if __name__ == "__main__":
    main()
