"""Records of `__consumer_offsets`, in Apache Kafka's own key and value formats.

All big-endian; strings are int16 length + UTF-8 (-1: null), bytes int32 length + data::

    OffsetCommitKey    version int16 = 1 | group string | topic string | partition int32
    OffsetCommitValue  version int16 = 3 | offset int64 | leader_epoch int32 | metadata string
                       | commit_timestamp int64
    GroupMetadataKey   version int16 = 2 | group string
    GroupMetadataValue version int16 = 3 | protocol_type string | generation int32
                       | protocol nullable string | leader nullable string
                       | current_state_timestamp int64 | members int32 count x
                       (member_id string | group_instance_id nullable string | client_id string
                        | client_host string | rebalance_timeout int32 | session_timeout int32
                        | subscription bytes | assignment bytes)

A null value is a tombstone: the offset or group is gone. A group's records go to
partition `abs(java hashCode(group)) % offsets.topic.num.partitions`, as in Kafka.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

OFFSET_COMMIT_KEY_VERSION = 1
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_KEY_VERSION = 2
GROUP_METADATA_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's `Utils.abs(groupId.hashCode) % partitions`: Java's String.hashCode over
    UTF-16 code units, as a signed 32-bit value, Math.abs with MIN_VALUE mapped to 0."""
    h = 0
    data = group_id.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberValue, ...]


# Writing ---------------------------------------------------------------------------


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    data = value.encode()
    return _I16.pack(len(data)) + data


def _bytes(value: bytes) -> bytes:
    return _I32.pack(len(value)) + value


def encode_key(key: OffsetKey | GroupKey) -> bytes:
    if isinstance(key, OffsetKey):
        return (
            _I16.pack(OFFSET_COMMIT_KEY_VERSION)
            + _string(key.group)
            + _string(key.topic)
            + _I32.pack(key.partition)
        )
    return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group)


def encode_offset_value(value: OffsetValue) -> bytes:
    return (
        _I16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + _I64.pack(value.offset)
        + _I32.pack(value.leader_epoch)
        + _string(value.metadata)
        + _I64.pack(value.commit_timestamp_ms)
    )


def encode_group_value(value: GroupValue) -> bytes:
    members = b"".join(
        _string(m.member_id)
        + _string(m.group_instance_id)
        + _string(m.client_id)
        + _string(m.client_host)
        + _I32.pack(m.rebalance_timeout_ms)
        + _I32.pack(m.session_timeout_ms)
        + _bytes(m.subscription)
        + _bytes(m.assignment)
        for m in value.members
    )
    return (
        _I16.pack(GROUP_METADATA_VALUE_VERSION)
        + _string(value.protocol_type)
        + _I32.pack(value.generation)
        + _string(value.protocol)
        + _string(value.leader)
        + _I64.pack(value.current_state_timestamp_ms)
        + _I32.pack(len(value.members))
        + members
    )


# Reading ---------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, s: struct.Struct) -> int:
        (value,) = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return int(value)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def string(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        value = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return value

    def required_string(self) -> str:
        value = self.string()
        if value is None:
            raise ValueError(f"null string at position {self.pos}")
        return value

    def bytes_(self) -> bytes:
        n = self.i32()
        value = self.data[self.pos : self.pos + max(n, 0)]
        self.pos += max(n, 0)
        return value


def decode_key(data: bytes) -> OffsetKey | GroupKey | None:
    """The key of a record, or None for record types this broker does not keep."""
    r = _Reader(data)
    version = r.i16()
    if version in (0, 1):
        return OffsetKey(r.required_string(), r.required_string(), r.i32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupKey(r.required_string())
    return None


def decode_offset_value(data: bytes) -> OffsetValue:
    r = _Reader(data)
    version = r.i16()
    if version != OFFSET_COMMIT_VALUE_VERSION:
        raise ValueError(f"offset commit value version {version} is not supported")
    return OffsetValue(r.i64(), r.i32(), r.required_string(), r.i64())


def decode_group_value(data: bytes) -> GroupValue:
    r = _Reader(data)
    version = r.i16()
    if version != GROUP_METADATA_VALUE_VERSION:
        raise ValueError(f"group metadata value version {version} is not supported")
    protocol_type, generation = r.required_string(), r.i32()
    protocol, leader, timestamp = r.string(), r.string(), r.i64()
    members = tuple(
        MemberValue(
            r.required_string(),
            r.string(),
            r.required_string(),
            r.required_string(),
            r.i32(),
            r.i32(),
            r.bytes_(),
            r.bytes_(),
        )
        for _ in range(r.i32())
    )
    return GroupValue(protocol_type, generation, protocol, leader, timestamp, members)
