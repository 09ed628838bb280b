"""Records of `__transaction_state`, in Apache Kafka's own key and value formats
(`TransactionLogKey` v0; `TransactionLogValue` v0, or from `transaction.version` 1 the
flexible v1, whose tagged fields carry what transactions v2 need across a coordinator
change: the previous and next producer ids and the client's transaction version).

All big-endian; strings are int16 length + UTF-8::

    TransactionLogKey    version int16 = 0 | transactional_id string
    TransactionLogValue  version int16 = 0 | producer_id int64 | producer_epoch int16
                         | transaction_timeout_ms int32 | transaction_status int8
                         | partitions int32 count (-1: null) x
                           (topic string | partition_ids int32 count x int32)
                         | last_update_timestamp_ms int64 | start_timestamp_ms int64

v1 has the same fields with compact (uvarint length + 1) strings and arrays, empty
tagged fields after each partition entry, and at the end the tagged fields that differ
from their defaults: 0 previous producer id, 1 next producer id (int64, default -1),
2 client transaction version (int16, default 0).

A null value is a tombstone: the transactional id expired. A transactional id's records
go to partition `abs(java hashCode(id)) % transaction.state.log.num.partitions`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from tierbroker.broker.coordinator.transaction.metadata import TransactionState
from tierbroker.storage.topic_partition import TopicPartition

KEY_VERSION = 0
_VALUE_HEAD = struct.Struct(">hqhib")
_I64 = struct.Struct(">q")
PREVIOUS_PRODUCER_ID, NEXT_PRODUCER_ID, CLIENT_TRANSACTION_VERSION = 0, 1, 2  # v1 tags
_TIMESTAMPS = struct.Struct(">qq")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0


def encode_key(transactional_id: str) -> bytes:
    data = transactional_id.encode()
    return _I16.pack(KEY_VERSION) + _I16.pack(len(data)) + data


def decode_key(data: bytes) -> str:
    (version,) = _I16.unpack_from(data)
    if version != KEY_VERSION:
        raise ValueError(f"TransactionLogKey version {version}")
    (length,) = _I16.unpack_from(data, 2)
    return data[4 : 4 + length].decode()


def encode_value(value: TransactionLogValue, version: int) -> bytes:
    """`value` as TransactionLogValue `version` (0 or 1)."""
    flexible = version >= 1
    out = bytearray(
        _VALUE_HEAD.pack(
            version, value.producer_id, value.producer_epoch, value.timeout_ms, value.state
        )
    )
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(value.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    out += _count(len(by_topic), flexible)
    for topic, partitions in by_topic.items():
        name = topic.encode()
        out += (_uvarint(len(name) + 1) if flexible else _I16.pack(len(name))) + name
        out += _count(len(partitions), flexible)
        out += struct.pack(f">{len(partitions)}i", *partitions)
        if flexible:
            out += _uvarint(0)  # the entry's tagged fields
    out += _TIMESTAMPS.pack(value.last_update_ms, value.start_ms)
    if flexible:
        tagged = [
            (tag, layout.pack(field))
            for tag, layout, field, default in (
                (PREVIOUS_PRODUCER_ID, _I64, value.previous_producer_id, -1),
                (NEXT_PRODUCER_ID, _I64, value.next_producer_id, -1),
                (CLIENT_TRANSACTION_VERSION, _I16, value.client_transaction_version, 0),
            )
            if field != default
        ]
        out += _uvarint(len(tagged))
        for tag, data in tagged:
            out += _uvarint(tag) + _uvarint(len(data)) + data
    return bytes(out)


def decode_value(data: bytes) -> TransactionLogValue:
    """A TransactionLogValue of version 0 or 1 (unknown tagged fields are skipped)."""
    version, producer_id, epoch, timeout_ms, status = _VALUE_HEAD.unpack_from(data)
    if version not in (0, 1):
        raise ValueError(f"TransactionLogValue version {version}")
    flexible = version == 1
    reader = _Reader(data, _VALUE_HEAD.size)
    partitions: set[TopicPartition] = set()
    for _ in range(reader.count(flexible)):
        length = reader.uvarint() - 1 if flexible else reader.unpack(_I16)
        topic = reader.take(length).decode()
        count = reader.count(flexible)
        for partition in struct.unpack(f">{count}i", reader.take(4 * count)):
            partitions.add(TopicPartition(topic, partition))
        if flexible:
            reader.skip_tagged_fields()
    last_update_ms, start_ms = reader.unpack(_TIMESTAMPS, 2)
    tags: dict[int, bytes] = {}
    if flexible:
        for _ in range(reader.uvarint()):
            tag = reader.uvarint()
            tags[tag] = reader.take(reader.uvarint())
    return TransactionLogValue(
        producer_id,
        epoch,
        timeout_ms,
        TransactionState(status),
        frozenset(partitions),
        last_update_ms,
        start_ms,
        _I64.unpack(tags[PREVIOUS_PRODUCER_ID])[0] if PREVIOUS_PRODUCER_ID in tags else -1,
        _I64.unpack(tags[NEXT_PRODUCER_ID])[0] if NEXT_PRODUCER_ID in tags else -1,
        _I16.unpack(tags[CLIENT_TRANSACTION_VERSION])[0]
        if CLIENT_TRANSACTION_VERSION in tags
        else 0,
    )


def _count(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else _I32.pack(n)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes, position: int) -> None:
        self.data, self.position = data, position

    def take(self, n: int) -> bytes:
        if n < 0 or self.position + n > len(self.data):
            raise ValueError(f"TransactionLogValue: {n} bytes past the end")
        chunk = self.data[self.position : self.position + n]
        self.position += n
        return chunk

    def unpack(self, layout: struct.Struct, fields: int = 1) -> Any:
        values = layout.unpack(self.take(layout.size))
        return values if fields > 1 else values[0]

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            (byte,) = self.take(1)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("TransactionLogValue: a varint of more than 5 bytes")

    def count(self, flexible: bool) -> int:
        """An array's length; null (-1, or compact 0) is empty."""
        return max(self.uvarint() - 1 if flexible else self.unpack(_I32), 0)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())
