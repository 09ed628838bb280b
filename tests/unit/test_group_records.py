"""`__consumer_offsets` records: Kafka's byte layouts, round trips, and Kafka's partitioning.

The expected partition of a group is computed here from Java's algorithms, written
out independently of the broker: `String.hashCode` over UTF-16 code units with int32
overflow, then Kafka's `Utils.abs(hashCode) % partitions`, where `Utils.abs` is
`Math.abs` except that `Integer.MIN_VALUE` maps to 0 (GroupMetadataManager.partitionFor,
GroupCoordinatorService.partitionFor).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierbroker.broker.coordinator.group.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
    partition_for,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def java_string_hash_code(s: str) -> int:
    """java.lang.String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 units, as int32."""
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    h = 0
    for unit in units:
        h = (31 * h + unit) % 2**32
    return h - 2**32 if h > INT32_MAX else h


def kafka_partition_for(group_id: str, partitions: int) -> int:
    """Kafka: Utils.abs(groupId.hashCode()) % partitions."""
    h = java_string_hash_code(group_id)
    return (0 if h == INT32_MIN else abs(h)) % partitions


# String.hashCode values as the JVM computes them (well-known or checked by hand).
KNOWN_HASH_CODES = {
    "": 0,
    "a": 97,
    "group": 98629247,
    "polygenelubricants": INT32_MIN,  # the classic string whose hashCode is Integer.MIN_VALUE
}


@pytest.mark.parametrize(("s", "expected"), sorted(KNOWN_HASH_CODES.items()))
def test_reference_hash_code_is_javas(s: str, expected: int) -> None:
    assert java_string_hash_code(s) == expected


def test_partition_of_group_is_javas_hash_modulo_partitions() -> None:
    # "group".hashCode() = 98629247, 98629247 % 50 = 47
    assert partition_for("group", 50) == 47
    assert partition_for("group", 1) == 0
    assert partition_for("", 50) == 0


@pytest.mark.parametrize(
    "group_id",
    [
        "my-group",  # hashCode -1906497762: Kafka takes Math.abs, so partition 12 of 50
        "consumer-group",  # hashCode -1738392088: partition 38 of 50
        "groupé",  # non-ASCII, one UTF-16 unit per character; negative hashCode
        "グループ",  # non-ASCII, positive hashCode
        "😀group",  # a surrogate pair: two UTF-16 units for one code point
        "polygenelubricants",  # hashCode Integer.MIN_VALUE: Utils.abs gives 0
    ],
)
def test_partition_matches_kafka_for_negative_and_non_ascii_ids(group_id: str) -> None:
    assert partition_for(group_id, 50) == kafka_partition_for(group_id, 50)


def test_known_negative_hash_partitions() -> None:
    assert java_string_hash_code("my-group") == -1906497762
    assert partition_for("my-group", 50) == 1906497762 % 50 == 12


@given(st.text(max_size=40), st.integers(1, 200))
def test_partition_for_matches_kafka_for_any_group_id(group_id: str, partitions: int) -> None:
    assert partition_for(group_id, partitions) == kafka_partition_for(group_id, partitions)


# Byte layouts --------------------------------------------------------------------------


def test_offset_commit_key_layout_is_kafkas() -> None:
    # OffsetCommitKey v1: version int16 | group string | topic string | partition int32
    assert encode_key(OffsetKey("g", "t", 3)) == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + (
        b"\x00\x00\x00\x03"
    )
    # GroupMetadataKey v2: version int16 | group string
    assert encode_key(GroupKey("grp")) == b"\x00\x02\x00\x03grp"


def test_offset_commit_value_layout_is_kafkas() -> None:
    # OffsetCommitValue v3: offset int64 | leader_epoch int32 | metadata string | timestamp int64
    data = encode_offset_value(OffsetValue(42, 7, "md", 1_700_000_000_000))
    assert data == (
        b"\x00\x03"
        + struct.pack(">q", 42)
        + struct.pack(">i", 7)
        + b"\x00\x02md"
        + struct.pack(">q", 1_700_000_000_000)
    )


def test_group_metadata_value_layout_is_kafkas() -> None:
    value = GroupValue(
        "consumer",
        5,
        "range",
        "m-1",
        123,
        (MemberValue("m-1", None, "c", "/1.2.3.4", 300_000, 10_000, b"\x01", b"\x02\x03"),),
    )
    expected = (
        b"\x00\x03"
        + b"\x00\x08consumer"
        + struct.pack(">i", 5)
        + b"\x00\x05range"
        + b"\x00\x03m-1"
        + struct.pack(">q", 123)
        + struct.pack(">i", 1)
        + b"\x00\x03m-1"
        + b"\xff\xff"  # null group_instance_id
        + b"\x00\x01c"
        + b"\x00\x08/1.2.3.4"
        + struct.pack(">ii", 300_000, 10_000)
        + struct.pack(">i", 1)
        + b"\x01"
        + struct.pack(">i", 2)
        + b"\x02\x03"
    )
    assert encode_group_value(value) == expected
    assert decode_group_value(expected) == value


def test_offset_commit_key_version_0_is_read_like_version_1() -> None:
    data = b"\x00\x00" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x09"
    assert decode_key(data) == OffsetKey("g", "t", 9)


def test_keys_of_other_record_types_are_skipped() -> None:
    # Kafka 3.x/4.x also writes consumer-group (KIP-848) and share-group records with
    # key versions >= 3; a classic coordinator leaves them alone.
    assert decode_key(b"\x00\x03\x00\x01g") is None
    assert decode_key(b"\x00\x0b\x00\x01g") is None


def test_unsupported_value_versions_are_refused_not_misread() -> None:
    with pytest.raises(ValueError):
        decode_offset_value(b"\x00\x09" + b"\x00" * 30)
    with pytest.raises(ValueError):
        decode_group_value(b"\x00\x09" + b"\x00" * 30)


# Round trips ---------------------------------------------------------------------------

names = st.text(max_size=30)
int32s = st.integers(INT32_MIN, INT32_MAX)
int64s = st.integers(INT64_MIN, INT64_MAX)
blobs = st.binary(max_size=200)

members = st.builds(
    MemberValue,
    member_id=names,
    group_instance_id=st.none() | names,
    client_id=names,
    client_host=names,
    rebalance_timeout_ms=int32s,
    session_timeout_ms=int32s,
    subscription=blobs,
    assignment=blobs,
)
group_values = st.builds(
    GroupValue,
    protocol_type=names,
    generation=int32s,
    protocol=st.none() | names,
    leader=st.none() | names,
    current_state_timestamp_ms=int64s,
    members=st.lists(members, max_size=5).map(tuple),
)
offset_values = st.builds(
    OffsetValue, offset=int64s, leader_epoch=int32s, metadata=names, commit_timestamp_ms=int64s
)


@given(st.builds(OffsetKey, group=names, topic=names, partition=int32s))
def test_offset_key_round_trip(key: OffsetKey) -> None:
    assert decode_key(encode_key(key)) == key


@given(st.builds(GroupKey, group=names))
def test_group_key_round_trip(key: GroupKey) -> None:
    assert decode_key(encode_key(key)) == key


@given(offset_values)
def test_offset_value_round_trip(value: OffsetValue) -> None:
    assert decode_offset_value(encode_offset_value(value)) == value


@given(group_values)
def test_group_value_round_trip(value: GroupValue) -> None:
    assert decode_group_value(encode_group_value(value)) == value


@given(group_values)
def test_group_value_encoding_is_exactly_consumed(value: GroupValue) -> None:
    """Nothing is left over or missing: a trailing byte would mean a field was skipped."""
    data = encode_group_value(value)
    members_size = sum(
        2 * 4
        + 4
        + 4
        + len(m.subscription)
        + len(m.assignment)
        + sum(2 + len(s.encode()) for s in (m.member_id, m.client_id, m.client_host))
        + (2 + len(m.group_instance_id.encode()) if m.group_instance_id is not None else 2)
        for m in value.members
    )
    header_size = (
        2
        + 2
        + len(value.protocol_type.encode())
        + 4
        + (2 + len(value.protocol.encode()) if value.protocol is not None else 2)
        + (2 + len(value.leader.encode()) if value.leader is not None else 2)
        + 8
        + 4
    )
    assert len(data) == header_size + members_size
