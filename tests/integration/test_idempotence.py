"""The idempotent producer on the wire, as Apache Kafka answers it: InitProducerId, replays,
sequence gaps, epochs, restarts; and DescribeProducers, DeleteRecords, DescribeLogDirs.

Requests are kio entities sent with `WireClient`; batches are built with
`protocol.records.build_batch`, so each test knows every byte it put in the log.
"""

from __future__ import annotations

import datetime
import signal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_log_dirs.v4.request import DescribableLogDirTopic, DescribeLogDirsRequest
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)

from tests.integration.broker_process import BrokerProcess
from tests.integration.wire import WireClient, produce_batch
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch, decode_records

LATEST, EARLIEST = -1, -2


# Wire helpers ------------------------------------------------------------------------


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def still_serving(port: int) -> None:
    """The broker answers ApiVersions on a new connection."""
    with WireClient(port) as fresh:
        response = fresh.request(
            ApiVersionsRequest(client_software_name="test", client_software_version="1")
        )
        assert response.error_code == ErrorCode.none


def init_producer_id(client: WireClient) -> Any:
    return client.request(
        InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        )
    )


def idempotent_batch(pid: int, epoch: int, seq: int, count: int) -> bytes:
    return build_batch(
        [
            (b"k", b"p%d-e%d-s%d" % (pid, epoch, seq + i), [], 1_000_000 + seq + i)
            for i in range(count)
        ],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def produce(client: WireClient, topic: str, batch: bytes, partition: int = 0) -> tuple[int, int]:
    """(error code, base offset) of one batch sent with acks=all."""
    answer = produce_batch(client, topic, batch, partition)
    return int(answer.error_code), int(answer.base_offset)


def list_offset(client: WireClient, topic: str, timestamp: int, partition: int = 0) -> int:
    response = client.request(
        ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=(
                ListOffsetsTopic(
                    name=topic,
                    partitions=(
                        ListOffsetsPartition(
                            partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
                        ),
                    ),
                ),
            ),
        )
    )
    [p] = response.topics[0].partitions
    assert p.error_code == ErrorCode.none, p
    return int(p.offset)


def fetch(client: WireClient, topic: str, offset: int, partition: int = 0) -> Any:
    response = client.request(
        FetchRequest(
            cluster_id=None,
            replica_id=-1,
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=0,
            max_bytes=50_000_000,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(
                FetchTopic(
                    topic=topic,
                    partitions=(
                        FetchPartition(
                            partition=partition,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=50_000_000,
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
    )
    [p] = response.responses[0].partitions
    return p


def stored(client: WireClient, topic: str, partition: int = 0) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record from the log start to the high watermark."""
    start = list_offset(client, topic, EARLIEST, partition)
    p = fetch(client, topic, start, partition)
    assert p.error_code == ErrorCode.none, p
    return [(r.offset, r.value) for r in decode_records(p.records or b"")]


def describe_producers(client: WireClient, topic: str, partition: int = 0) -> Any:
    response = client.request(
        DescribeProducersRequest(topics=(TopicRequest(name=topic, partition_indexes=(partition,)),))
    )
    [p] = response.topics[0].partitions
    return p


def values(pid: int, epoch: int, seq: int, count: int) -> list[bytes]:
    return [b"p%d-e%d-s%d" % (pid, epoch, seq + i) for i in range(count)]


# InitProducerId, replays, gaps, epochs -------------------------------------------------


def test_replay_is_acknowledged_with_its_offset_and_stored_once(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "idem")
    with WireClient(broker.port) as client:
        init = init_producer_id(client)
        assert init.error_code == ErrorCode.none
        assert init.producer_id >= 0 and init.producer_epoch == 0
        other = init_producer_id(client)
        assert other.error_code == ErrorCode.none and other.producer_id != init.producer_id
        pid = int(init.producer_id)

        first = idempotent_batch(pid, 0, 0, 3)
        assert produce(client, "idem", first) == (ErrorCode.none, 0)
        assert produce(client, "idem", first) == (ErrorCode.none, 0)  # the same request again
        assert list_offset(client, "idem", LATEST) == 3
        assert stored(client, "idem") == list(enumerate(values(pid, 0, 0, 3)))

        second = idempotent_batch(pid, 0, 3, 2)
        assert produce(client, "idem", second) == (ErrorCode.none, 3)
        assert produce(client, "idem", second) == (ErrorCode.none, 3)
        assert produce(client, "idem", first) == (ErrorCode.none, 0)  # one of the last five
        assert list_offset(client, "idem", LATEST) == 5
        assert stored(client, "idem") == list(
            enumerate(values(pid, 0, 0, 3) + values(pid, 0, 3, 2))
        )
    still_serving(broker.port)


def test_sequence_gap_is_out_of_order_and_changes_nothing(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "gaps")
    with WireClient(broker.port) as client:
        pid = int(init_producer_id(client).producer_id)
        assert produce(client, "gaps", idempotent_batch(pid, 0, 0, 5)) == (ErrorCode.none, 0)
        # The next sequence is 5; 6 and 9 leave a gap, 3 overlaps what was written.
        for seq in (6, 9, 3):
            error, _ = produce(client, "gaps", idempotent_batch(pid, 0, seq, 2))
            assert error == ErrorCode.out_of_order_sequence_number, seq
            still_serving(broker.port)
        assert list_offset(client, "gaps", LATEST) == 5
        assert produce(client, "gaps", idempotent_batch(pid, 0, 5, 1)) == (ErrorCode.none, 5)
        assert [v for _, v in stored(client, "gaps")] == values(pid, 0, 0, 6)


def test_producer_epochs_fence_older_ones(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "epochs")
    with WireClient(broker.port) as client:
        pid = int(init_producer_id(client).producer_id)
        assert produce(client, "epochs", idempotent_batch(pid, 0, 0, 2)) == (ErrorCode.none, 0)
        # A new epoch starts its sequence at 0 (an idempotent producer bumps it itself, KIP-360).
        error, _ = produce(client, "epochs", idempotent_batch(pid, 1, 2, 1))
        assert error == ErrorCode.out_of_order_sequence_number
        assert produce(client, "epochs", idempotent_batch(pid, 1, 0, 2)) == (ErrorCode.none, 2)
        # The older epoch is fenced, whatever its sequence, even its own last batch.
        for seq in (2, 0):
            error, _ = produce(client, "epochs", idempotent_batch(pid, 0, seq, 2))
            assert error == ErrorCode.invalid_producer_epoch, seq
            still_serving(broker.port)
        assert list_offset(client, "epochs", LATEST) == 4
        state = describe_producers(client, "epochs")
        assert state.error_code == ErrorCode.none
        [producer] = [s for s in state.active_producers if s.producer_id == pid]
        assert (producer.producer_epoch, producer.last_sequence) == (1, 1)


def test_producer_without_state_may_continue_at_any_sequence(broker: BrokerProcess) -> None:
    """Kafka 2.5+ (KIP-360, ProducerAppendInfo.checkSequence): a producer id the partition has
    no state for (its batches went with retention or DeleteRecords, or the topic is new)
    is accepted at any sequence; UNKNOWN_PRODUCER_ID is no longer returned."""
    create_topic(broker.bootstrap, "unknown-pid")
    with WireClient(broker.port) as client:
        pid = int(init_producer_id(client).producer_id)
        error, base = produce(client, "unknown-pid", idempotent_batch(pid, 0, 7, 2))
        assert (error, base) == (ErrorCode.none, 0)
        assert produce(client, "unknown-pid", idempotent_batch(pid, 0, 9, 1)) == (
            ErrorCode.none,
            2,
        )
    still_serving(broker.port)


# Restarts ----------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_producer_state_survives_a_restart(
    broker_factory: type[BrokerProcess], tmp_path: Path, sig: signal.Signals
) -> None:
    broker = broker_factory(tmp_path).start()
    create_topic(broker.bootstrap, "durable", partitions=2)
    with WireClient(broker.port) as client:
        pid_a = int(init_producer_id(client).producer_id)
        pid_b = int(init_producer_id(client).producer_id)
        assert produce(client, "durable", idempotent_batch(pid_a, 0, 0, 4)) == (ErrorCode.none, 0)
        last_a = idempotent_batch(pid_a, 0, 4, 3)
        assert produce(client, "durable", last_a) == (ErrorCode.none, 4)
        last_b = idempotent_batch(pid_b, 0, 0, 5)
        assert produce(client, "durable", last_b, partition=1) == (ErrorCode.none, 0)
    broker.stop(sig)
    broker = broker.restarted()
    with WireClient(broker.port) as client:
        # The last batch of each producer is still recognised.
        assert produce(client, "durable", last_a) == (ErrorCode.none, 4)
        assert produce(client, "durable", last_b, partition=1) == (ErrorCode.none, 0)
        assert list_offset(client, "durable", LATEST) == 7
        assert list_offset(client, "durable", LATEST, partition=1) == 5
        assert [v for _, v in stored(client, "durable")] == values(pid_a, 0, 0, 7)
        # Sequences and epochs go on from where they were.
        error, _ = produce(client, "durable", idempotent_batch(pid_a, 0, 8, 1))
        assert error == ErrorCode.out_of_order_sequence_number
        assert produce(client, "durable", idempotent_batch(pid_a, 0, 7, 1)) == (ErrorCode.none, 7)
        [state] = describe_producers(client, "durable", partition=1).active_producers
        assert (state.producer_id, state.producer_epoch, state.last_sequence) == (pid_b, 0, 4)
        # Producer ids are never handed out twice, across restarts too.
        fresh = init_producer_id(client)
        assert fresh.error_code == ErrorCode.none
        assert fresh.producer_id not in (pid_a, pid_b)
    still_serving(broker.port)
    broker.stop()
    assert "Traceback" not in broker.log(), broker.log()


# DescribeProducers, DeleteRecords, DescribeLogDirs ------------------------------------------


def test_describe_producers_of_a_client_producer(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "described", partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(30):
        producer.produce("described", b"v%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    with WireClient(broker.port) as client:
        for partition in (0, 1):
            state = describe_producers(client, "described", partition)
            assert state.error_code == ErrorCode.none
            [active] = state.active_producers
            assert active.producer_id >= 0 and active.producer_epoch == 0
            assert active.last_sequence == 14  # 15 records per partition, sequences 0-14
            assert active.last_timestamp > 0
        missing = describe_producers(client, "described", partition=7)
        assert missing.error_code == ErrorCode.unknown_topic_or_partition


def test_delete_records_moves_the_log_start(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "trim")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with WireClient(broker.port) as client:
        pid = int(init_producer_id(client).producer_id)
        for seq in range(0, 100, 10):
            assert produce(client, "trim", idempotent_batch(pid, 0, seq, 10))[0] == ErrorCode.none

        [result] = [
            f.result(10) for f in admin.delete_records([TopicPartition("trim", 0, 40)]).values()
        ]
        assert result.low_watermark == 40
        assert list_offset(client, "trim", EARLIEST) == 40
        assert list_offset(client, "trim", LATEST) == 100
        assert fetch(client, "trim", 10).error_code == ErrorCode.offset_out_of_range
        assert [o for o, _ in stored(client, "trim")] == list(range(40, 100))

        # Not past the high watermark (Kafka: OFFSET_OUT_OF_RANGE).
        [beyond] = admin.delete_records([TopicPartition("trim", 0, 1_000)]).values()
        with pytest.raises(KafkaException, match="OFFSET_OUT_OF_RANGE"):
            beyond.result(10)
        assert list_offset(client, "trim", EARLIEST) == 40
        still_serving(broker.port)

        # -1: up to the high watermark.
        [to_end] = [
            f.result(10) for f in admin.delete_records([TopicPartition("trim", 0, -1)]).values()
        ]
        assert to_end.low_watermark == 100
        assert list_offset(client, "trim", EARLIEST) == 100

        # The producer's state outlives its records (Kafka keeps it until it expires):
        # its last batch is still a duplicate and its sequence goes on.
        assert produce(client, "trim", idempotent_batch(pid, 0, 90, 10)) == (ErrorCode.none, 90)
        assert produce(client, "trim", idempotent_batch(pid, 0, 100, 1)) == (ErrorCode.none, 100)
        assert list_offset(client, "trim", LATEST) == 101


def test_describe_log_dirs_reports_the_bytes_stored(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "sized", partitions=2)
    with WireClient(broker.port) as client:
        pid = int(init_producer_id(client).producer_id)
        batches = [idempotent_batch(pid, 0, seq, 7) for seq in range(0, 70, 7)]
        for batch in batches:
            assert produce(client, "sized", batch)[0] == ErrorCode.none
        assert produce(client, "sized", batches[-1])[0] == ErrorCode.none  # a replay adds nothing

        def sizes(topics: Any) -> dict[tuple[str, int], int]:
            response = client.request(DescribeLogDirsRequest(topics=topics))
            assert response.error_code == ErrorCode.none
            assert response.results and all(
                r.error_code == ErrorCode.none for r in response.results
            )
            return {
                (t.name, p.partition_index): int(p.partition_size)
                for r in response.results
                for t in r.topics
                for p in t.partitions
            }

        only = sizes((DescribableLogDirTopic(topic="sized", partitions=(0,)),))
        # Kafka stores batches as they came: the partition holds exactly their bytes.
        assert only == {("sized", 0): sum(len(b) for b in batches)}
        everything = sizes(None)
        assert everything[("sized", 0)] == only[("sized", 0)]
        assert everything[("sized", 1)] == 0
        response = client.request(DescribeLogDirsRequest(topics=None))
        [result] = response.results
        assert Path(result.log_dir).is_absolute()
        assert result.total_bytes > 0 and 0 < result.usable_bytes <= result.total_bytes
