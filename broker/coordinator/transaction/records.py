"""Records of `__transaction_state`, in Apache Kafka's own key and value formats
(`TransactionLogKey` v0, `TransactionLogValue` v0, which Kafka writes until
`transaction.version` 1 is finalized).

All big-endian; strings are int16 length + UTF-8::

    TransactionLogKey    version int16 = 0 | transactional_id string
    TransactionLogValue  version int16 = 0 | producer_id int64 | producer_epoch int16
                         | transaction_timeout_ms int32 | transaction_status int8
                         | partitions int32 count (-1: null) x
                           (topic string | partition_ids int32 count x int32)
                         | last_update_timestamp_ms int64 | start_timestamp_ms int64

A null value is a tombstone: the transactional id expired. A transactional id's records
go to partition `abs(java hashCode(id)) % transaction.state.log.num.partitions`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tierbroker.broker.coordinator.transaction.metadata import TransactionState
from tierbroker.storage.topic_partition import TopicPartition

KEY_VERSION = 0
VALUE_VERSION = 0
_VALUE_HEAD = struct.Struct(">hqhib")
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


def encode_key(transactional_id: str) -> bytes:
    data = transactional_id.encode()
    return _I16.pack(KEY_VERSION) + _I16.pack(len(data)) + data


def decode_key(data: bytes) -> str:
    (version,) = _I16.unpack_from(data)
    if version != KEY_VERSION:
        raise ValueError(f"TransactionLogKey version {version}")
    (length,) = _I16.unpack_from(data, 2)
    return data[4 : 4 + length].decode()


def encode_value(value: TransactionLogValue) -> bytes:
    out = bytearray(
        _VALUE_HEAD.pack(
            VALUE_VERSION, value.producer_id, value.producer_epoch, value.timeout_ms, value.state
        )
    )
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(value.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    out += _I32.pack(len(by_topic))
    for topic, partitions in by_topic.items():
        name = topic.encode()
        out += _I16.pack(len(name)) + name + _I32.pack(len(partitions))
        out += struct.pack(f">{len(partitions)}i", *partitions)
    out += _TIMESTAMPS.pack(value.last_update_ms, value.start_ms)
    return bytes(out)


def decode_value(data: bytes) -> TransactionLogValue:
    version, producer_id, epoch, timeout_ms, status = _VALUE_HEAD.unpack_from(data)
    if version != VALUE_VERSION:  # v1 comes with transaction.version 1, not finalized here
        raise ValueError(f"TransactionLogValue version {version}")
    position = _VALUE_HEAD.size
    (topics,) = _I32.unpack_from(data, position)
    position += 4
    partitions: set[TopicPartition] = set()
    for _ in range(max(topics, 0)):
        (length,) = _I16.unpack_from(data, position)
        topic = data[position + 2 : position + 2 + length].decode()
        position += 2 + length
        (count,) = _I32.unpack_from(data, position)
        position += 4
        for partition in struct.unpack_from(f">{count}i", data, position):
            partitions.add(TopicPartition(topic, partition))
        position += 4 * count
    last_update_ms, start_ms = _TIMESTAMPS.unpack_from(data, position)
    return TransactionLogValue(
        producer_id,
        epoch,
        timeout_ms,
        TransactionState(status),
        frozenset(partitions),
        last_update_ms,
        start_ms,
    )
