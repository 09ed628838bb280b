"""A log dir on a small filesystem that fills up, as an operator meets it: a real broker,
a confluent-kafka producer with acks=all producing until errors arrive, space given back,
a restart; then every acknowledged record is there exactly once, in order, and no offset
was handed out twice. With a free-space floor (`log.dir.min.free.bytes`) the broker
refuses produce below it instead, serves reads, and accepts produce again once space is
freed, without a restart. The filesystem is a tmpfs mounted by the test (root needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.waiting import wait_for

# Rolls (new files) happen before it is full; no floor: the disk fills up, as in Kafka.
SMALL_SEGMENTS = {"log.segment.bytes": "262144", "log.dir.min.free.bytes": "0"}
FLOOR_BYTES = 768 << 10  # on the 2 MiB filesystem
VALUE_BYTES = 1000

Acked = dict[int, bytes]  # offset -> value, partition 0


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs; `grow(small_fs)` gives space back. Unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.fail("mounting a small tmpfs needs root: run the disk-full tests as root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def grow(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)


def value_of(seq: int) -> bytes:
    return (b"%08d-" % seq) * (VALUE_BYTES // 9)


class AckingProducer:
    """acks=all, no retries (a retry could write a record twice): what is acknowledged is
    recorded by offset, every error by code."""

    def __init__(self, bootstrap: str, topic: str, first_seq: int = 0) -> None:
        self.topic = topic
        self.acked: Acked = {}
        self.errors: list[int] = []
        self.seq = first_seq
        self.offsets_twice: list[int] = []
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "retries": 0,
                "linger.ms": 5,
                "message.timeout.ms": 10_000,
            }
        )

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err.code())
        elif msg.offset() in self.acked:
            self.offsets_twice.append(msg.offset())
        else:
            self.acked[msg.offset()] = msg.value()

    def produce(self, count: int) -> None:
        """Send `count` records and wait until each one is acknowledged or failed."""
        for _ in range(count):
            self._producer.produce(self.topic, value_of(self.seq), on_delivery=self._on_delivery)
            self.seq += 1
            self._producer.poll(0)
        assert self._producer.flush(30) == 0

    def produce_until_errors(self, chunk: int = 100, max_records: int = 20_000) -> None:
        while not self.errors:
            assert self.seq < max_records, "the filesystem never filled up"
            self.produce(chunk)


def read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of partition 0, up to its high watermark."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "disk-full", "enable.auto.commit": False}
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), 10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(got) < high:
            assert time.monotonic() < deadline, f"read {len(got)} of {high}"
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value()))
        return got
    finally:
        consumer.close()


def assert_exactly_acked(got: list[tuple[int, bytes]], acked: Acked) -> None:
    """Dense offsets, and exactly the acknowledged records at their acknowledged offsets:
    none lost, none repeated, none that failed (a failed append leaves nothing)."""
    assert [o for o, _ in got] == list(range(len(got)))
    assert dict(got) == acked, (
        f"{len(got)} records read, {len(acked)} acknowledged; "
        f"lost {sorted(set(acked) - dict(got).keys())[:10]}, "
        f"unacknowledged {sorted(dict(got).keys() - set(acked))[:10]}"
    )
    assert [int(v[:8]) for _, v in got] == sorted(int(v[:8]) for _, v in got)


def offline_lines(log: str, log_dir: Path) -> list[str]:
    return [line for line in log.splitlines() if f"log dir {log_dir} is offline" in line]


def test_full_log_dir_answers_storage_error_and_loses_nothing(
    broker_factory: type[BrokerProcess], tmp_path: Path, small_fs: Path
) -> None:
    """Two log dirs, the first on the small filesystem: its partition answers
    KAFKA_STORAGE_ERROR, the other dir's partition goes on; after space returns and a
    kill -9, everything acknowledged is there once and the log goes on from its end."""
    full_dir, other_dir = small_fs / "logs", tmp_path / "other"
    broker = broker_factory(
        tmp_path, {**SMALL_SEGMENTS, "log.dirs": f"{full_dir},{other_dir}"}
    ).start()
    create_topic(broker.bootstrap, "full")
    create_topic(broker.bootstrap, "other")
    assert (full_dir / "full-0").is_dir() and (other_dir / "other-0").is_dir()

    producer = AckingProducer(broker.bootstrap, "full")
    producer.produce_until_errors()
    producer.produce(50)  # the dir is offline now: every one fails, none is written
    assert set(producer.errors) == {KafkaError.KAFKA_STORAGE_ERROR}
    assert len(producer.acked) > 500  # it did fill up by appends, not at once
    other = AckingProducer(broker.bootstrap, "other")
    other.produce(100)
    assert (other.errors, len(other.acked)) == ([], 100)
    assert broker.process is not None and broker.process.poll() is None
    lines = offline_lines(broker.log(), full_dir)
    assert len(lines) == 1 and "ENOSPC" in lines[0], lines

    grow(small_fs)
    broker.stop(signal.SIGKILL)
    broker = broker.restarted()
    got = read_all(broker.bootstrap, "full")
    assert_exactly_acked(got, producer.acked)
    assert_exactly_acked(read_all(broker.bootstrap, "other"), other.acked)

    end = len(got)
    producer = AckingProducer(broker.bootstrap, "full", first_seq=producer.seq)
    producer.produce(100)
    assert producer.errors == [] and sorted(producer.acked) == list(range(end, end + 100))
    assert_exactly_acked(read_all(broker.bootstrap, "full"), {**dict(got), **producer.acked})
    assert producer.offsets_twice == []


def test_only_log_dir_full_stops_the_broker_cleanly(
    broker_factory: type[BrokerProcess], tmp_path: Path, small_fs: Path
) -> None:
    """One log dir: when it fails the broker stops, exits 1 with one line naming the dir
    and the errno; after space returns it starts and everything acknowledged is there."""
    log_dir = small_fs / "logs"
    broker = broker_factory(tmp_path, {**SMALL_SEGMENTS, "log.dirs": str(log_dir)}).start()
    create_topic(broker.bootstrap, "full")
    producer = AckingProducer(broker.bootstrap, "full")
    producer.produce_until_errors()
    assert producer.errors[0] == KafkaError.KAFKA_STORAGE_ERROR, producer.errors[:5]
    assert broker.process is not None
    assert broker.process.wait(30) == 1
    log = broker.log()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(log_dir) in errors[0] and "ENOSPC" in errors[0], errors
    assert "Traceback" not in log, log
    assert not (log_dir / ".kafka_cleanshutdown").exists()

    grow(small_fs)
    broker = broker.restarted()
    got = read_all(broker.bootstrap, "full")
    assert_exactly_acked(got, producer.acked)
    more = AckingProducer(broker.bootstrap, "full", first_seq=producer.seq)
    more.produce(100)
    assert more.errors == [] and sorted(more.acked) == list(range(len(got), len(got) + 100))
    assert_exactly_acked(read_all(broker.bootstrap, "full"), {**producer.acked, **more.acked})


def test_delete_topic_frees_a_full_disk(
    broker_factory: type[BrokerProcess], tmp_path: Path, small_fs: Path
) -> None:
    """DeleteTopics on a full log dir (which also holds the cluster metadata) frees its
    data; the deletion survives a restart and the other topic is intact."""
    full_dir, other_dir = small_fs / "logs", tmp_path / "other"
    broker = broker_factory(
        tmp_path, {**SMALL_SEGMENTS, "log.dirs": f"{full_dir},{other_dir}"}
    ).start()
    create_topic(broker.bootstrap, "full")
    create_topic(broker.bootstrap, "other")
    AckingProducer(broker.bootstrap, "full").produce_until_errors()
    other = AckingProducer(broker.bootstrap, "other")
    other.produce(100)
    free_before = os.statvfs(small_fs).f_bavail

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["full"])["full"].result(15)
    # The broker deletes the log once its metadata says the topic is gone, off the event loop.
    wait_for(lambda: not (full_dir / "full-0").exists(), "the log renamed for deletion")
    wait_for(lambda: os.statvfs(small_fs).f_bavail > free_before + 100, "the space freed")

    assert broker.stop() == 0
    broker = broker.restarted()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert set(admin.list_topics(timeout=10).topics) >= {"other"}
    assert "full" not in admin.list_topics(timeout=10).topics
    assert_exactly_acked(read_all(broker.bootstrap, "other"), other.acked)


def floor_lines(log: str, log_dir: Path) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if f"log dir {log_dir} has" in line and "below log.dir.min.free.bytes" in line
    ]


def test_below_the_free_space_floor_produce_is_refused_until_space_is_freed(
    broker_factory: type[BrokerProcess], tmp_path: Path, small_fs: Path
) -> None:
    """Below `log.dir.min.free.bytes` every partition of the dir answers produce with
    KAFKA_STORAGE_ERROR and one log line says why; consumers read everything acknowledged;
    DeleteTopics frees space and produce goes on, without a restart or an offline dir."""
    log_dir = small_fs / "logs"
    broker = broker_factory(
        tmp_path,
        {
            **SMALL_SEGMENTS,
            "log.dirs": str(log_dir),
            "log.dir.min.free.bytes": str(FLOOR_BYTES),
            "offsets.topic.num.partitions": "1",  # its logs, made by read_all, take space too
        },
    ).start()
    create_topic(broker.bootstrap, "full")
    create_topic(broker.bootstrap, "kept")
    producer = AckingProducer(broker.bootstrap, "full")
    producer.produce_until_errors()
    producer.produce(50)
    kept = AckingProducer(broker.bootstrap, "kept")
    kept.produce(10)
    assert set(producer.errors) == set(kept.errors) == {KafkaError.KAFKA_STORAGE_ERROR}
    assert len(producer.acked) > 200 and kept.acked == {}
    assert os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize > 0
    assert_exactly_acked(read_all(broker.bootstrap, "full"), producer.acked)

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["full"])["full"].result(15)
    # A stock producer retries KAFKA_STORAGE_ERROR: it gets through once space is freed.
    retrying = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 60_000})
    delivered: list[int] = []
    for seq in range(100):
        retrying.produce(
            "kept",
            value_of(seq),
            on_delivery=lambda err, msg: delivered.append(err or msg.offset()),
        )
    assert retrying.flush(90) == 0
    assert sorted(delivered) == list(range(100)), (delivered[:3], broker.log())
    assert [v for _, v in read_all(broker.bootstrap, "kept")] == [value_of(s) for s in range(100)]

    assert broker.process is not None and broker.process.poll() is None
    log = broker.log()
    assert offline_lines(log, log_dir) == [], log
    assert len(floor_lines(log, log_dir)) == 1, floor_lines(log, log_dir)
    assert f"log dir {log_dir} has" in log and "accepting produce again" in log, log
    assert broker.stop() == 0
