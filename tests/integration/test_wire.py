"""Wire-level protocol semantics, request by request, checked against what Apache Kafka answers.

Requests are kio entities sent with `tests.integration.wire`; records are built with
`protocol.records.build_batch` (or produced with confluent-kafka) so that offsets,
timestamps and batch boundaries are known exactly.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.index import load_payload_module
from kio.static.constants import EntityType

from tests.integration.broker_process import BrokerProcess
from tests.integration.wire import (
    FetchSpec,
    WireClient,
    create_topic,
    decode_response,
    fetch_request,
    list_offsets,
    make,
    produce_batch,
    request_module,
    split_batches,
)
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import BatchView, build_batch, decode_batch

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
UNDEFINED = -1


# Building requests of any version ------------------------------------------------------------


def api_versions(client: WireClient, version: int = 3) -> Any:
    m = request_module(18, version)
    return client.request(
        make(m.ApiVersionsRequest, client_software_name="wire-test", client_software_version="1")
    )


def produce(client: WireClient, topic: str, records: bytes, partition: int = 0) -> int:
    """Produce (acks=all); returns the base offset."""
    answer = produce_batch(client, topic, records, partition)
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.base_offset)


def batch_of(values: Sequence[bytes], timestamps: Sequence[int] | None = None) -> bytes:
    now = int(time.time() * 1000)
    stamps = timestamps or [now] * len(values)
    return build_batch([(None, v, (), ts) for v, ts in zip(values, stamps, strict=True)])


def fetch(client: WireClient, version: int, topics: FetchSpec, **kwargs: Any) -> Any:
    response = client.request(fetch_request(version, topics, **kwargs))
    assert response.error_code == ErrorCode.none
    return response


def values_of(records: bytes | None) -> list[bytes | None]:
    batches, _ = split_batches(records)
    return [r.value for b in batches for r in decode_batch(BatchView(b)).records]


@pytest.fixture
def client(broker: BrokerProcess) -> Any:
    with WireClient(broker.port) as c:
        yield c


# ApiVersions and Metadata ----------------------------------------------------------------------


@pytest.mark.parametrize("version", range(5))
def test_api_versions_every_version(client: WireClient, version: int) -> None:
    """v0-v4 answered in the request's version; from v3 the body is flexible but the response
    header stays v0 (kio's response classes say so; `wire` decodes by them, strictly)."""
    m = request_module(18, version)
    request = make(
        m.ApiVersionsRequest, client_software_name="wire-test", client_software_version="1"
    )
    correlation_id = client.send(request)
    frame = client.read_frame()
    response_cls = load_payload_module(18, version, EntityType.response).ApiVersionsResponse
    got, response = decode_response(response_cls, frame)
    assert got == correlation_id
    assert response.error_code == ErrorCode.none
    # Header v0: the error code right after the correlation id, then the array length
    # (a compact uvarint from v3), with no tagged-fields byte in between.
    assert frame[4:6] == b"\0\0"
    if version >= 3:
        assert frame[6] == len(response.api_keys) + 1
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges[18] == (0, 4)
    assert {0, 1, 2, 3, 18} <= set(ranges)
    assert api_versions(client, 3).error_code == ErrorCode.none, "the connection is still usable"


def test_produce_is_advertised_from_v0(client: WireClient) -> None:
    ranges = {k.api_key: (k.min_version, k.max_version) for k in api_versions(client).api_keys}
    assert ranges[0][0] == 0
    assert ranges[0][1] >= 9


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_metadata_returns_topic_ids(client: WireClient, version: int) -> None:
    topic_id = create_topic(client, "with-id", partitions=2)
    assert topic_id != uuid.UUID(int=0)
    m = request_module(3, version)
    response = client.request(
        make(
            m.MetadataRequest,
            topics=(m.MetadataRequestTopic(name="with-id", topic_id=None),),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    )
    (topic,) = response.topics
    assert (topic.error_code, topic.name, topic.topic_id) == (ErrorCode.none, "with-id", topic_id)
    assert [p.partition_index for p in topic.partitions] == [0, 1]


@pytest.mark.parametrize("version", [12, 13])
def test_metadata_by_topic_id(client: WireClient, version: int) -> None:
    topic_id = create_topic(client, "found-by-id", partitions=3)
    create_topic(client, "other")
    m = request_module(3, version)
    unknown = uuid.uuid4()
    response = client.request(
        m.MetadataRequest(
            topics=(
                m.MetadataRequestTopic(topic_id=topic_id, name=None),
                m.MetadataRequestTopic(topic_id=unknown, name=None),
            ),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    )
    found, missing = response.topics
    assert (found.error_code, found.name, found.topic_id) == (
        ErrorCode.none,
        "found-by-id",
        topic_id,
    )
    assert len(found.partitions) == 3
    assert missing.error_code == ErrorCode.unknown_topic_id
    assert missing.topic_id == unknown
    assert missing.name is None


# Fetch ---------------------------------------------------------------------------------------


def test_fetch_v12_by_name_and_v13_plus_by_topic_id(client: WireClient) -> None:
    topic_id = create_topic(client, "fetched")
    produce(client, "fetched", batch_of([b"a", b"b"]))
    produce(client, "fetched", batch_of([b"c"]))
    by_name = fetch(client, 12, [("fetched", [(0, 0)])])
    (topic,) = by_name.responses
    assert topic.topic == "fetched"
    (partition,) = topic.partitions
    assert (partition.error_code, partition.high_watermark) == (ErrorCode.none, 3)
    assert values_of(partition.records) == [b"a", b"b", b"c"]
    for version in range(13, 19):
        response = fetch(client, version, [(topic_id, [(0, 1)]), (uuid.uuid4(), [(0, 0)])])
        known, unknown = response.responses
        assert known.topic_id == topic_id
        (partition,) = known.partitions
        assert partition.error_code == ErrorCode.none, version
        assert partition.high_watermark == 3
        # The batch holding offset 1 starts at offset 0: whole batches are returned.
        assert values_of(partition.records) == [b"a", b"b", b"c"], version
        assert unknown.partitions[0].error_code == ErrorCode.unknown_topic_id, version


def test_full_fetch_lists_every_requested_partition(client: WireClient) -> None:
    create_topic(client, "sparse", partitions=4)
    create_topic(client, "empty", partitions=2)
    produce(client, "sparse", batch_of([b"only here"]), partition=2)
    response = fetch(
        client, 12, [("sparse", [(0, 0), (1, 0), (2, 0), (3, 0)]), ("empty", [(1, 0), (0, 0)])]
    )
    assert response.session_id == 0
    listed = [(t.topic, [p.partition_index for p in t.partitions]) for t in response.responses]
    assert listed == [("sparse", [0, 1, 2, 3]), ("empty", [1, 0])]
    for topic in response.responses:
        for p in topic.partitions:
            assert p.error_code == ErrorCode.none
            has_data = (topic.topic, p.partition_index) == ("sparse", 2)
            assert p.high_watermark == (1 if has_data else 0)
            assert values_of(p.records) == ([b"only here"] if has_data else [])


def test_fetch_of_an_empty_partition_answers_after_max_wait(client: WireClient) -> None:
    create_topic(client, "quiet")
    response = fetch(client, 12, [("quiet", [(0, 0)])], max_wait_ms=500, min_bytes=1)
    (partition,) = response.responses[0].partitions
    assert partition.error_code == ErrorCode.none
    assert not partition.records


def test_waiting_fetch_returns_when_records_arrive(
    broker: BrokerProcess, client: WireClient
) -> None:
    create_topic(client, "awaited")
    # Longer than the client's socket timeout: only an answer at the records' arrival comes.
    correlation_id = client.send(fetch_request(12, [("awaited", [(0, 0)])], max_wait_ms=600_000))
    time.sleep(0.3)  # a fetch that did not wait would answer without the record
    with WireClient(broker.port) as producer:
        produce(producer, "awaited", batch_of([b"wake up"]))
    response = client.receive(_fetch_response(12), correlation_id)
    (partition,) = response.responses[0].partitions
    assert values_of(partition.records) == [b"wake up"]


def _fetch_response(version: int) -> Any:
    return load_payload_module(1, version, EntityType.response).FetchResponse


def _fill(
    client: WireClient, topic: str, partition: int, batches: int, value_bytes: int
) -> list[int]:
    """Produce `batches` one-record batches; returns their sizes."""
    sizes = []
    for i in range(batches):
        records = batch_of([bytes([65 + i]) * value_bytes])
        produce(client, topic, records, partition=partition)
        sizes.append(len(records))
    return sizes


def test_fetch_partition_max_bytes(client: WireClient) -> None:
    create_topic(client, "limited")
    sizes = _fill(client, "limited", 0, batches=6, value_bytes=900)
    limit = 2 * sizes[0] + sizes[0] // 2  # two and a half batches
    (partition,) = (
        fetch(client, 12, [("limited", [(0, 0)])], partition_max_bytes=limit)
        .responses[0]
        .partitions
    )
    assert 0 < len(partition.records) <= limit
    whole, _partial = split_batches(partition.records)
    assert len(whole) == 2
    # A limit below the first batch still returns that one whole batch (KIP-74), and no more.
    (partition,) = (
        fetch(client, 12, [("limited", [(0, 3)])], partition_max_bytes=100).responses[0].partitions
    )
    whole, partial = split_batches(partition.records)
    assert (len(whole), partial) == (1, 0)
    assert values_of(partition.records) == [b"D" * 900]


def test_fetch_max_bytes_across_partitions(client: WireClient) -> None:
    create_topic(client, "shared", partitions=2)
    sizes = _fill(client, "shared", 0, batches=4, value_bytes=900)
    _fill(client, "shared", 1, batches=4, value_bytes=900)
    limit = 3 * sizes[0]
    response = fetch(client, 12, [("shared", [(0, 0), (1, 0)])], max_bytes=limit)
    first, second = response.responses[0].partitions
    total = len(first.records or b"") + len(second.records or b"")
    assert 0 < total <= limit
    assert len(split_batches(first.records)[0]) == 3, "the first partition takes what it can"
    assert len(split_batches(second.records)[0]) == 0
    # max_bytes below the first batch: that one whole batch, nothing from the next partition.
    response = fetch(client, 12, [("shared", [(0, 0), (1, 0)])], max_bytes=10)
    first, second = response.responses[0].partitions
    assert [len(b) for b in split_batches(first.records)[0]] == [sizes[0]]
    assert split_batches(first.records)[1] == 0
    assert not second.records


def test_fetched_batches_carry_leader_epoch_0(broker: BrokerProcess, client: WireClient) -> None:
    create_topic(client, "epochs")
    produce(client, "epochs", batch_of([b"built"]))  # partitionLeaderEpoch -1 as sent
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(3):
        producer.produce("epochs", value=b"librdkafka-%d" % i)
        producer.flush(10)
    (partition,) = fetch(client, 12, [("epochs", [(0, 0)])]).responses[0].partitions
    batches, partial = split_batches(partition.records)
    assert (len(batches), partial) == (4, 0)
    assert [struct.unpack_from(">i", b, 12)[0] for b in batches] == [0, 0, 0, 0]
    assert [struct.unpack_from(">q", b, 0)[0] for b in batches] == [0, 1, 2, 3]


# ListOffsets ----------------------------------------------------------------------------------


def test_list_offsets_single_record_batches(client: WireClient) -> None:
    create_topic(client, "timed")
    assert list_offsets(client, "timed", EARLIEST)[:2] == (ErrorCode.none, 0)
    assert list_offsets(client, "timed", LATEST)[:2] == (ErrorCode.none, 0)
    for ts in (1000, 3000, 2000):  # offsets 0, 1, 2; the largest timestamp is at offset 1
        produce(client, "timed", batch_of([b"%d" % ts], [ts]))
    none = ErrorCode.none
    assert list_offsets(client, "timed", EARLIEST) == (none, 0, -1, 0)
    assert list_offsets(client, "timed", LATEST) == (none, 3, -1, 0)
    assert list_offsets(client, "timed", 0) == (none, 0, 1000, 0)
    assert list_offsets(client, "timed", 1000) == (none, 0, 1000, 0)
    assert list_offsets(client, "timed", 1500) == (none, 1, 3000, 0)
    assert list_offsets(client, "timed", 2500) == (none, 1, 3000, 0)
    assert list_offsets(client, "timed", 3001) == (none, UNDEFINED, UNDEFINED, UNDEFINED)
    assert list_offsets(client, "timed", MAX_TIMESTAMP) == (none, 1, 3000, 0)


def test_list_offsets_inside_a_batch(client: WireClient) -> None:
    """Kafka answers with the record's offset and timestamp, not its batch's: by timestamp,
    the first record at or after it (FileRecords.searchForTimestamp); for -3 the first record
    holding the largest timestamp (RecordBatch.offsetOfMaxTimestamp)."""
    create_topic(client, "batched")
    produce(client, "batched", batch_of([b"a", b"b", b"c", b"d"], [1000, 2000, 5000, 3000]))
    targets = (EARLIEST, 1000, 1500, 2500, 3500, 5001, MAX_TIMESTAMP, LATEST)
    answers = {
        t: list_offsets(client, "batched", t)[1:] for t in targets
    }  # (offset, timestamp, epoch)
    assert all(list_offsets(client, "batched", t)[0] == ErrorCode.none for t in targets)
    assert answers == {
        EARLIEST: (0, -1, 0),
        1000: (0, 1000, 0),
        1500: (1, 2000, 0),
        2500: (2, 5000, 0),
        3500: (2, 5000, 0),
        5001: (UNDEFINED, UNDEFINED, UNDEFINED),
        MAX_TIMESTAMP: (2, 5000, 0),
        LATEST: (4, -1, 0),
    }


# OffsetForLeaderEpoch -------------------------------------------------------------------------


def offset_for_leader_epoch(
    client: WireClient,
    version: int,
    topic: str,
    epoch: int,
    current_leader_epoch: int = -1,
) -> tuple[int, int, int]:
    m = request_module(23, version)
    response = client.request(
        make(
            m.OffsetForLeaderEpochRequest,
            replica_id=-2,
            topics=(
                m.OffsetForLeaderTopic(
                    topic=topic,
                    partitions=(
                        m.OffsetForLeaderPartition(
                            partition=0,
                            current_leader_epoch=current_leader_epoch,
                            leader_epoch=epoch,
                        ),
                    ),
                ),
            ),
        )
    )
    (p,) = response.topics[0].partitions
    return p.error_code, p.leader_epoch, p.end_offset


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch(client: WireClient, version: int) -> None:
    create_topic(client, "epoch-ends")
    produce(client, "epoch-ends", batch_of([b"1", b"2"]))
    produce(client, "epoch-ends", batch_of([b"3"]))
    none = ErrorCode.none
    assert offset_for_leader_epoch(client, version, "epoch-ends", 0) == (none, 0, 3)
    assert offset_for_leader_epoch(client, version, "epoch-ends", 0, current_leader_epoch=0) == (
        none,
        0,
        3,
    )
    assert offset_for_leader_epoch(client, version, "epoch-ends", 7) == (none, UNDEFINED, UNDEFINED)
    assert offset_for_leader_epoch(client, version, "epoch-ends", 0, current_leader_epoch=1)[0] == (
        ErrorCode.unknown_leader_epoch
    )
    assert (
        offset_for_leader_epoch(client, version, "no-such-topic", 0)[0]
        == ErrorCode.unknown_topic_or_partition
    )


@pytest.mark.parametrize("version", [2, 4])
def test_offset_for_leader_epoch_of_an_empty_partition(client: WireClient, version: int) -> None:
    """Kafka records the leader epoch's start offset when the replica becomes leader
    (Partition.makeLeader: maybeAssignEpochStartOffset), not at the first append: epoch 0
    of an empty partition ends at the log end offset, 0."""
    create_topic(client, "nothing-yet")
    assert offset_for_leader_epoch(client, version, "nothing-yet", 0) == (ErrorCode.none, 0, 0)
