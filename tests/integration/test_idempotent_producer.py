"""The idempotent producer at the wire level: duplicates, gaps, fencing, restarts; and the
admin calls around records and producers."""

from __future__ import annotations

import datetime
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.integration.broker_process import BrokerProcess
from tests.integration.wire import WireClient


def create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(15)


def init_producer_id(
    client: WireClient, transactional_id: str | None = None
) -> tuple[ErrorCode, int, int]:
    response = client.request(
        InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        )
    )
    return response.error_code, response.producer_id, response.producer_epoch


def produce(
    client: WireClient, topic: str, pid: int, epoch: int, seq: int, count: int = 3
) -> tuple[ErrorCode, int]:
    batch = build_batch(
        [(None, b"seq-%d" % (seq + i), [], 1000 + seq + i) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    response = client.request(
        ProduceRequest(
            acks=-1,
            timeout=datetime.timedelta(seconds=5),
            topic_data=(
                TopicProduceData(
                    name=topic, partition_data=(PartitionProduceData(index=0, records=batch),)
                ),
            ),
        )
    )
    partition = response.responses[0].partition_responses[0]
    return partition.error_code, partition.base_offset


def latest_offset(client: WireClient, topic: str) -> int:
    response = client.request(
        ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=(
                ListOffsetsTopic(
                    name=topic,
                    partitions=(
                        ListOffsetsPartition(
                            partition_index=0, current_leader_epoch=-1, timestamp=-1
                        ),
                    ),
                ),
            ),
        )
    )
    return int(response.topics[0].partitions[0].offset)


def test_replayed_batch_is_acknowledged_once_and_gaps_are_refused(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        create_topic(broker.bootstrap, "idem")
        with WireClient(broker.port) as client:
            error, pid, epoch = init_producer_id(client)
            assert error == ErrorCode.none and pid >= 0 and epoch == 0
            assert produce(client, "idem", pid, epoch, 0) == (ErrorCode.none, 0)
            assert produce(client, "idem", pid, epoch, 3) == (ErrorCode.none, 3)
            assert produce(client, "idem", pid, epoch, 3) == (ErrorCode.none, 3)  # a replay
            assert latest_offset(client, "idem") == 6
            assert (
                produce(client, "idem", pid, epoch, 10)[0] == ErrorCode.out_of_order_sequence_number
            )
            assert produce(client, "idem", pid, epoch + 1, 0) == (ErrorCode.none, 6)  # a new epoch
            assert produce(client, "idem", pid, epoch, 9)[0] == ErrorCode.invalid_producer_epoch
            assert produce(client, "idem", pid + 1000, 0, 7)[0] == ErrorCode.unknown_producer_id
            assert latest_offset(client, "idem") == 9
        # The state survives a clean restart and a crash: the last batch is still a duplicate.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            broker.stop(sig)
            broker = broker.restarted()
            with WireClient(broker.port) as client:
                assert produce(client, "idem", pid, epoch + 1, 0) == (ErrorCode.none, 6)
                assert latest_offset(client, "idem") == 9
                new_pid = init_producer_id(client)[1]
                assert new_pid != pid, "producer ids are never handed out twice"
    finally:
        broker.kill()


def test_transactional_producer_fails_fast(broker: BrokerProcess) -> None:
    with WireClient(broker.port) as client:
        error, _, _ = init_producer_id(client, "txn-1")
        assert error == ErrorCode.transactional_id_authorization_failed
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-2"})
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)authoriz"):
        producer.init_transactions(10)
    assert time.monotonic() - started < 10
    assert "transactions are not supported" in broker.log()


def test_delete_records_and_log_dirs_and_producers(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "records")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(100):
        producer.produce("records", b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deleted = admin.delete_records([TopicPartition("records", 0, 40)])
    [result] = [f.result(10) for f in deleted.values()]
    assert result.low_watermark == 40
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lw"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("records", 0), 10) == (40, 100)
    finally:
        consumer.close()
    from kio.schema.describe_log_dirs.v4.request import (
        DescribableLogDirTopic,
        DescribeLogDirsRequest,
    )
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest

    with WireClient(broker.port) as client:
        dirs = client.request(
            DescribeLogDirsRequest(
                topics=(DescribableLogDirTopic(topic="records", partitions=(0,)),)
            )
        )
        [partition] = [p for r in dirs.results for t in r.topics for p in t.partitions]
        assert partition.partition_size > 0
        producers = client.request(
            DescribeProducersRequest(topics=(TopicRequest(name="records", partition_indexes=(0,)),))
        )
        [state] = producers.topics[0].partitions[0].active_producers
        assert state.last_sequence == 99 and state.producer_epoch == 0
