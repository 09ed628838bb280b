"""Consumer groups with other clients: aiokafka, kafka-python and kcat's balanced consumer.

Each client's own idempotent producer writes while a group of two members of that
client reads; the members' union covers every offset, their commits land, and a
later member of the same group resumes at the committed offsets.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess

PARTITIONS = 6


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def create_topic(admin: AdminClient, name: str) -> None:
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(15)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(CTopicPartition(topic, p), 10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def all_offsets(ends: dict[int, int], starts: dict[int, int] | None = None) -> set[tuple[int, int]]:
    return {(p, o) for p, end in ends.items() for o in range((starts or {}).get(p, 0), end)}


def committed(admin: AdminClient, group: str, topic: str) -> dict[int, int]:
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(
        10
    )
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic}


def stable_with(admin: AdminClient, group: str, members: int) -> bool:
    d = admin.describe_consumer_groups([group])[group].result(10)
    return bool(
        d.state == ConsumerGroupState.STABLE
        and len(d.members) == members
        and all(m.assignment.topic_partitions for m in d.members)
    )


# aiokafka ----------------------------------------------------------------------------


async def test_aiokafka_group(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import CommitFailedError, RebalanceInProgressError
    from aiokafka.structs import OffsetAndMetadata

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(admin, "aio")
    members = [
        AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            group_id="G-aio",
            client_id=f"aio-{i}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=500,
        )
        for i in range(2)
    ]
    seen: set[tuple[int, int]] = set()
    stop = asyncio.Event()

    async def run(member: AIOKafkaConsumer) -> None:
        while not stop.is_set():
            batches = await member.getmany(timeout_ms=100, max_records=1_000)
            offsets = {}
            for tp, records in batches.items():
                seen.update((r.partition, r.offset) for r in records)
                offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "")
            if offsets:
                try:
                    await member.commit(offsets)
                except (CommitFailedError, RebalanceInProgressError):
                    pass  # the generation moved on; the partition's next owner reads it again

    for m in members:
        await m.start()
        m.subscribe(["aio"])
    tasks = [asyncio.create_task(run(m)) for m in members]
    try:
        deadline = time.monotonic() + 30
        while not (all(m.assignment() for m in members) and stable_with(admin, "G-aio", 2)):
            assert time.monotonic() < deadline, "both aiokafka members assigned"
            await asyncio.sleep(0.1)

        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            sends = [await producer.send("aio", b"v%d" % i, key=b"k%d" % i) for i in range(6_000)]
            await asyncio.gather(*sends)
        finally:
            await producer.stop()
        ends = end_offsets(broker.bootstrap, "aio")
        assert sum(ends.values()) == 6_000
        expected = all_offsets(ends)
        deadline = time.monotonic() + 60
        while not (expected <= seen and committed(admin, "G-aio", "aio") == ends):
            assert time.monotonic() < deadline, f"{len(expected - seen)} offsets never consumed"
            await asyncio.sleep(0.1)
        assert seen == expected
        parts = sorted(tp.partition for m in members for tp in m.assignment())
        assert parts == list(range(PARTITIONS)), "the two members share the topic"
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for m in members:
            await m.stop()

    # A new member resumes at the committed offsets.
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send("aio", b"more") for _ in range(60)])
    finally:
        await producer.stop()
    later = AIOKafkaConsumer(
        "aio",
        bootstrap_servers=broker.bootstrap,
        group_id="G-aio",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await later.start()
    read: set[tuple[int, int]] = set()
    try:
        deadline = time.monotonic() + 30
        while len(read) < 60:
            assert time.monotonic() < deadline, "the later member's records"
            for records in (await later.getmany(timeout_ms=200)).values():
                read.update((r.partition, r.offset) for r in records)
    finally:
        await later.stop()
    assert read == all_offsets(end_offsets(broker.bootstrap, "aio"), ends)


# kafka-python ------------------------------------------------------------------------------


def test_kafka_python_group(broker: BrokerProcess) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.errors import CommitFailedError, RebalanceInProgressError
        from kafka.structs import OffsetAndMetadata

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(admin, "kp")
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []

    def member(name: str) -> None:
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            group_id="G-kp",
            client_id=name,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=500,
        )
        try:
            consumer.subscribe(["kp"])
            while not stop.is_set():
                batches = consumer.poll(timeout_ms=100, max_records=1_000)
                offsets = {}
                for tp, records in batches.items():
                    with lock:
                        seen.update((r.partition, r.offset) for r in records)
                    offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
                if offsets:
                    try:
                        consumer.commit(offsets)
                    except (CommitFailedError, RebalanceInProgressError):
                        pass
        except BaseException as e:  # reported by the test thread
            failures.append(e)
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(f"kp-{i}",), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: stable_with(admin, "G-kp", 2), 30, "both kafka-python members assigned")
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        assert producer.config["enable_idempotence"] is True  # the default in kafka-python 3
        futures = [producer.send("kp", b"v%d" % i, key=b"k%d" % i) for i in range(4_000)]
        producer.flush(60)
        for f in futures:
            f.get(10)
        producer.close()
        ends = end_offsets(broker.bootstrap, "kp")
        assert sum(ends.values()) == 4_000
        expected = all_offsets(ends)

        def done() -> bool:
            with lock:
                return expected <= seen and committed(admin, "G-kp", "kp") == ends

        wait_for(done, 60, "every offset consumed and committed")
        assert seen == expected
        assert not failures, failures
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not failures, failures


# kcat ------------------------------------------------------------------------------------


def kcat() -> str:
    path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is not installed: run `make test` (apt-get install -y kcat)")
    return path


def kcat_produce(bootstrap: str, topic: str, values: list[str]) -> None:
    """Each value keyed by itself: the keys spread the records over every partition."""
    done = subprocess.run(
        [kcat(), "-P", "-b", bootstrap, "-t", topic, "-K", ":", "-X", "enable.idempotence=true"],
        input="".join(f"{v}:{v}\n" for v in values),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def kcat_group_args(bootstrap: str, group: str, topic: str) -> list[str]:
    return [
        kcat(),
        "-b",
        bootstrap,
        "-G",
        group,
        topic,
        "-f",
        "%p:%o\n",
        "-u",
        "-X",
        "auto.offset.reset=earliest",
    ]


def parse(text: str) -> list[tuple[int, int]]:
    """kcat's `partition:offset` lines; a last line it is still writing waits for later."""
    complete = text[: text.rfind("\n") + 1]
    return [(int(p), int(o)) for p, o in (line.split(":") for line in complete.split())]


def test_kcat_balanced_consumers(broker: BrokerProcess, tmp_path: Path) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(admin, "kc")
    outputs = [tmp_path / f"kcat-{i}.out" for i in range(2)]
    procs = []
    for out in outputs:
        with open(out, "w") as stdout, open(out.with_suffix(".err"), "w") as stderr:
            procs.append(
                subprocess.Popen(
                    kcat_group_args(broker.bootstrap, "G-kcat", "kc"), stdout=stdout, stderr=stderr
                )
            )
    try:
        wait_for(lambda: stable_with(admin, "G-kcat", 2), 30, "both kcat members assigned")
        kcat_produce(broker.bootstrap, "kc", [f"v{i}" for i in range(3_000)])
        ends = end_offsets(broker.bootstrap, "kc")
        assert sum(ends.values()) == 3_000 and all(ends.values()), ends
        expected = all_offsets(ends)

        def read() -> list[tuple[int, int]]:
            return [line for out in outputs for line in parse(out.read_text())]

        wait_for(lambda: expected <= set(read()), 60, "kcat members to read every offset")
        assert all(parse(out.read_text()) for out in outputs), "each member read a share"
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    assert [p.returncode for p in procs] == [0, 0], [
        o.with_suffix(".err").read_text() for o in outputs
    ]
    assert sorted(read()) == sorted(expected), "an offset was read twice or never"
    # On its way out each member committed what it read.
    assert committed(admin, "G-kcat", "kc") == ends

    # A later member resumes at the committed offsets: it reads only what came since.
    kcat_produce(broker.bootstrap, "kc", [f"later{i}" for i in range(300)])
    new_ends = end_offsets(broker.bootstrap, "kc")
    later = subprocess.run(
        [*kcat_group_args(broker.bootstrap, "G-kcat", "kc"), "-c", "300"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert later.returncode == 0, later.stderr
    assert sorted(parse(later.stdout)) == sorted(all_offsets(new_ends, ends))
