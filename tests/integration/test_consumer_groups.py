"""Consumer groups with stock clients: coverage, leaving members, commits across restarts,
static membership, and the other clients' group consumers."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess

PARTITIONS = 6


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def produce_idempotent(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    errors: list[object] = []
    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic,
                    b"v%d" % i,
                    b"k%d" % i,
                    on_delivery=lambda err, _m: errors.append(err) if err else None,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0 and errors == []


def group_consumer(bootstrap: str, group: str, **conf: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 500,
            **conf,
        }
    )


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def test_group_covers_every_offset_and_resumes_from_commits(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        create_topic(broker.bootstrap, "orders")
        seen: set[tuple[int, int]] = set()
        committed: dict[int, int] = {}
        lock = threading.Lock()
        stop_all = threading.Event()

        def member(name: str, leave_after: int | None) -> None:
            consumer = group_consumer(broker.bootstrap, "g1", **{"client.id": name})
            consumer.subscribe(["orders"])
            handled = 0
            try:
                while not stop_all.is_set():
                    messages = consumer.consume(500, 0.2)
                    for m in messages:
                        assert m.error() is None, m.error()
                        with lock:
                            seen.add((m.partition(), m.offset()))
                    if messages:
                        consumer.commit(asynchronous=False)
                        with lock:
                            for m in messages:
                                committed[m.partition()] = max(
                                    committed.get(m.partition(), 0), m.offset() + 1
                                )
                    handled += len(messages)
                    if leave_after is not None and handled >= leave_after:
                        return  # leaves the group midway (close() sends LeaveGroup)
            finally:
                consumer.close()

        members = [
            threading.Thread(target=member, args=(f"m{i}", 5_000 if i == 0 else None))
            for i in range(3)
        ]
        for t in members:
            t.start()
        produce_idempotent(broker.bootstrap, "orders", 60_000)
        expected = {
            (p, o) for p, end in end_offsets(broker.bootstrap, "orders").items() for o in range(end)
        }
        assert len(expected) == 60_000
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with lock:
                if expected <= seen and sum(committed.values()) == 60_000:
                    break
            time.sleep(0.2)
        stop_all.set()
        for t in members:
            t.join(30)
        assert expected <= seen, f"{len(expected - seen)} offsets never consumed"
        assert "member" in broker.log() and "left" in broker.log()

        assert broker.stop(signal.SIGTERM) == 0
        broker = broker.restarted()
        produce_idempotent(broker.bootstrap, "orders", 600)
        consumer = group_consumer(broker.bootstrap, "g1")
        consumer.subscribe(["orders"])
        first: dict[int, int] = {}
        deadline = time.monotonic() + 60
        try:
            while len(first) < PARTITIONS and time.monotonic() < deadline:
                for m in consumer.consume(500, 0.5):
                    first.setdefault(m.partition(), m.offset())
        finally:
            consumer.close()
        assert first == {p: committed[p] for p in first}, "committed offsets were read again"
        assert len(first) == PARTITIONS
    finally:
        broker.kill()


def test_static_member_returns_without_rebalancing_the_others(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "static")
    revoked: list[list[int]] = []
    assigned: list[list[int]] = []
    stay = group_consumer(broker.bootstrap, "g-static", **{"group.instance.id": "stay"})
    stay.subscribe(
        ["static"],
        on_assign=lambda c, ps: assigned.append([p.partition for p in ps]),
        on_revoke=lambda c, ps: revoked.append([p.partition for p in ps]),
    )
    # `stay` joins first and leads the group. A returning leader on JoinGroup < v9 (as
    # librdkafka sends) makes Kafka rebalance, to let it assign; a follower does not.
    deadline = time.monotonic() + 30
    while not assigned and time.monotonic() < deadline:
        stay.poll(0.1)
    leaving = group_consumer(broker.bootstrap, "g-static", **{"group.instance.id": "leaving"})
    leaving_parts: list[list[int]] = []
    leaving.subscribe(
        ["static"], on_assign=lambda c, ps: leaving_parts.append([p.partition for p in ps])
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stay.poll(0.1)
            leaving.poll(0.1)
            if (
                assigned
                and leaving_parts
                and len(assigned[-1]) + len(leaving_parts[-1]) == PARTITIONS
            ):
                break
        # Let the group settle: the first member may have been alone in generation 1.
        settle = time.monotonic() + 3
        while time.monotonic() < settle:
            stay.poll(0.1)
            leaving.poll(0.1)
        mine, theirs = sorted(assigned[-1]), sorted(leaving_parts[-1])
        assert sorted(mine + theirs) == list(range(PARTITIONS))
        revoked_before = len(revoked)
        leaving.close()  # a static member does not send LeaveGroup: the group waits for it
        back = group_consumer(broker.bootstrap, "g-static", **{"group.instance.id": "leaving"})
        back_parts: list[list[int]] = []
        back.subscribe(
            ["static"], on_assign=lambda c, ps: back_parts.append([p.partition for p in ps])
        )
        try:
            deadline = time.monotonic() + 20
            while not back_parts and time.monotonic() < deadline:
                back.poll(0.1)
                stay.poll(0.1)
            for _ in range(20):
                stay.poll(0.1)
            assert back_parts and sorted(back_parts[-1]) == theirs
            assert len(revoked) == revoked_before, "the other member was rebalanced"
            assert sorted(assigned[-1]) == mine
            assert "static member leaving rejoined" in broker.log()
        finally:
            back.close()
    finally:
        stay.close()


def test_admin_views_of_groups(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "admin-groups")
    produce_idempotent(broker.bootstrap, "admin-groups", 60)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    consumer = group_consumer(broker.bootstrap, "g-admin")
    consumer.subscribe(["admin-groups"])
    try:
        got = 0
        deadline = time.monotonic() + 30
        while got < 60 and time.monotonic() < deadline:
            got += len(consumer.consume(100, 0.2))
        consumer.commit(asynchronous=False)
        listed = {g.group_id for g in admin.list_consumer_groups().result(10).valid}
        assert "g-admin" in listed
        described = admin.describe_consumer_groups(["g-admin"])["g-admin"].result(10)
        assert described.state.name == "STABLE" and len(described.members) == 1
        deleted = admin.delete_consumer_groups(["g-admin"])["g-admin"]
        with pytest.raises(Exception, match="NON_EMPTY_GROUP"):
            deleted.result(10)
    finally:
        consumer.close()
    from confluent_kafka import ConsumerGroupTopicPartitions

    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("g-admin")])[
        "g-admin"
    ].result(10)
    assert sum(tp.offset for tp in offsets.topic_partitions) == 60
    admin.delete_consumer_groups(["g-admin"])["g-admin"].result(10)
    assert "g-admin" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}


def test_group_survives_sigkill_with_commits_intact(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        create_topic(broker.bootstrap, "kill")
        produce_idempotent(broker.bootstrap, "kill", 3_000)
        consumer = group_consumer(broker.bootstrap, "g-kill")
        consumer.subscribe(["kill"])
        got = 0
        deadline = time.monotonic() + 30
        while got < 3_000 and time.monotonic() < deadline:
            messages = consumer.consume(500, 0.2)
            got += len(messages)
            if messages:
                consumer.commit(asynchronous=False)
        committed = {
            tp.partition: tp.offset
            for tp in consumer.committed([TopicPartition("kill", p) for p in range(PARTITIONS)], 10)
        }
        assert sum(committed.values()) == 3_000
        broker.stop(signal.SIGKILL)
        broker = broker.restarted()
        produce_idempotent(broker.bootstrap, "kill", 60)
        more = 0
        deadline = time.monotonic() + 60
        while more < 60 and time.monotonic() < deadline:  # the member rejoins and carries on
            more += sum(1 for m in consumer.consume(100, 0.2) if m.error() is None)
        assert more == 60
        after = {
            tp.partition: tp.offset
            for tp in consumer.committed([TopicPartition("kill", p) for p in range(PARTITIONS)], 10)
        }
        assert after == committed
        consumer.close()
    finally:
        broker.kill()


def test_aiokafka_group_members_cover_the_topic(broker: BrokerProcess) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    create_topic(broker.bootstrap, "aio-group")

    async def run() -> set[tuple[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for i in range(3_000):
                await producer.send("aio-group", b"v%d" % i, key=b"k%d" % i)
            await producer.flush()
        finally:
            await producer.stop()
        members = [
            AIOKafkaConsumer(
                "aio-group",
                bootstrap_servers=broker.bootstrap,
                group_id="g-aio",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
            for _ in range(2)
        ]
        seen: set[tuple[int, int]] = set()
        for m in members:
            await m.start()
        try:
            deadline = time.monotonic() + 60
            while len(seen) < 3_000 and time.monotonic() < deadline:
                for m in members:
                    for records in (await m.getmany(timeout_ms=200)).values():
                        seen |= {(r.partition, r.offset) for r in records}
            assert all(m.assignment() for m in members), "both members got partitions"
        finally:
            for m in members:
                await m.stop()
        return seen

    assert len(asyncio.run(run())) == 3_000


def test_kafka_python_group_consumer(broker: BrokerProcess) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer

    create_topic(broker.bootstrap, "kp-group")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)  # idempotence on by default in 3.x
    for i in range(2_000):
        producer.send("kp-group", b"v%d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        "kp-group",
        bootstrap_servers=broker.bootstrap,
        group_id="g-kp",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    seen = {(m.partition, m.offset) for m in consumer}
    consumer.commit()
    consumer.close()
    assert len(seen) == 2_000


def test_kcat_balanced_consumer(broker: BrokerProcess) -> None:
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed: run `make test` (apt-get install -y kcat)")
    create_topic(broker.bootstrap, "kcat-group")
    produce_idempotent(broker.bootstrap, "kcat-group", 1_000)
    done = subprocess.run(
        [
            "kcat",
            "-b",
            broker.bootstrap,
            "-G",
            "g-kcat",
            "kcat-group",
            "-c",
            "1000",
            "-f",
            "%p:%o\n",
            "-X",
            "auto.offset.reset=earliest",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert len(set(done.stdout.split())) == 1_000
