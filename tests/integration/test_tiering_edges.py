"""Tiering edges the resilience tests do not reach: S3 down before anything is tiered, several
remote partitions in one fetch within its byte limits, the log start offset across restarts."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.moto_server import MotoServer
from tests.integration.tiering_helpers import all_status, status
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient
from tierbroker.protocol.errors import ErrorCode

FAST = {
    "remote.log.manager.task.interval.ms": "300",
    "log.retention.check.interval.ms": "300",
    "remote.log.manager.task.retry.backoff.max.ms": "1000",
}
TIERED = {
    "remote.storage.enable": "true",
    "segment.bytes": str(256 * 1024),
    "local.retention.bytes": str(512 * 1024),
}


def create(broker: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=TIERED)])[topic].result(15)


def produce(broker: BrokerProcess, topic: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": 1})
    for i in range(start, start + count):
        producer.produce(topic, b"x" * 500, b"%d" % i, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0


def read_keys(broker: BrokerProcess, topic: str, start: int, count: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "o", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, start)])
    got: list[bytes] = []
    deadline = time.monotonic() + 90
    try:
        while len(got) < count and time.monotonic() < deadline:
            got += [m.key() for m in consumer.consume(2000, 0.3) if m.error() is None]
    finally:
        consumer.close()
    return got


def s3_broker(tmp_path: Path, moto: MotoServer) -> BrokerProcess:
    moto.create_bucket("outage")
    return BrokerProcess(
        tmp_path,
        {
            **FAST,
            **moto.rsm_overrides("outage"),
            "rsm.config.storage.s3.api.call.timeout.ms": "2000",
            "rsm.config.storage.s3.retry.max.attempts": "2",
        },
    ).start()


def test_s3_down_before_tiering_then_back(tmp_path: Path) -> None:
    """Produce and local fetch go on; nothing is deleted locally; tiering resumes after."""
    moto = MotoServer().start()
    broker = s3_broker(tmp_path, moto)
    try:
        create(broker, "o")
        moto.stop()
        produce(broker, "o", 0, 6000)
        assert read_keys(broker, "o", 3000, 3000) == [b"%d" % i for i in range(3000, 6000)]
        wait_for(lambda: status(broker, "o")["copy_lag_segments"] >= 2, "the copy lag to grow")
        time.sleep(1)  # several retention checks
        s = status(broker, "o")
        assert s["copy_lag_segments"] == s["local_segments"] - 1  # every rolled segment waits
        assert s["local_log_start_offset"] == 0, "deleted locally before it was in the remote tier"
        moto.start()  # the same port; moto starts empty
        moto.create_bucket("outage")
        wait_for(
            lambda: (
                status(broker, "o")["copy_lag_segments"] == 0
                and status(broker, "o")["local_log_start_offset"] > 0
            ),
            "tiering to resume",
            60,
        )
        assert read_keys(broker, "o", 0, 6000) == [b"%d" % i for i in range(6000)]
    finally:
        broker.kill()
        moto.stop()


def test_several_remote_partitions_in_one_fetch_honour_the_byte_limits(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, FAST).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("multi", 3, 1, config=TIERED)])["multi"].result(15)
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.size": 16384}
        )
        for i in range(9000):
            producer.produce("multi", b"x" * 500, b"%d" % i, partition=i % 3)
            producer.poll(0)
        assert producer.flush(60) == 0
        wait_for(
            lambda: all(
                r["copy_lag_segments"] == 0 and r["local_log_start_offset"] > 0
                for r in all_status(broker)
                if r["topic"] == "multi"
            ),
            "all partitions tiered",
        )
        limit, partition_limit = 100_000, 60_000
        with WireClient(broker.port) as client:
            request = FetchRequest(
                replica_id=-1,
                max_wait=datetime.timedelta(milliseconds=500),
                min_bytes=1,
                max_bytes=limit,
                isolation_level=0,
                session_id=0,
                session_epoch=-1,
                topics=(
                    FetchTopic(
                        topic="multi",
                        partitions=tuple(
                            FetchPartition(
                                partition=p,
                                current_leader_epoch=-1,
                                fetch_offset=0,
                                log_start_offset=-1,
                                partition_max_bytes=partition_limit,
                            )
                            for p in range(3)
                        ),
                    ),
                ),
                forgotten_topics_data=(),
                rack_id="",
            )
            sizes = []
            for _ in range(10):  # the first answers may time out while indexes load
                response = client.request(request)
                parts = response.responses[0].partitions
                if all(p.error_code == ErrorCode.none for p in parts) and sum(
                    len(p.records or b"") for p in parts
                ):
                    sizes = [len(p.records or b"") for p in parts]
                    break
                time.sleep(0.3)
        assert sizes and sum(sizes) <= limit and all(s <= partition_limit for s in sizes)
        assert sum(1 for s in sizes if s > 0) >= 2, f"one remote partition only: {sizes}"
    finally:
        broker.kill()


def test_log_start_offset_survives_restarts(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, FAST).start()
    try:
        create(broker, "start")
        produce(broker, "start", 0, 6000)
        wait_for(
            lambda: (
                status(broker, "start").get("copy_lag_segments") == 0
                and status(broker, "start")["local_log_start_offset"] > 0
            ),
            "tiering",
        )
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        [deleted] = admin.delete_records([TopicPartition("start", 0, 1000)]).values()
        assert deleted.result(10).low_watermark == 1000
        for _ in range(2):
            broker.stop()
            broker = broker.restarted()
            s = status(broker, "start")
            assert s["log_start_offset"] == 1000, s
            assert s["local_log_start_offset"] > 1000
    finally:
        broker.kill()
