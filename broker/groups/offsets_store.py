"""`GroupMetadataManager`: committed offsets and group metadata, kept in `__consumer_offsets`.

Every commit and every completed rebalance is appended to the group's partition of
`__consumer_offsets` (see `records` for the formats) before it is acknowledged or
cached, so a restart rebuilds the same state by replaying the topic. The topic has
no compaction: it is kept whole (retention.ms=-1) and replayed in full at start.
Offsets of a group with no members expire `offsets.retention.minutes` after the
group became empty (KIP-211); their removal is written as tombstones.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from broker.cluster.controller import Controller
from broker.groups.records import (
    GroupKey,
    GroupValue,
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
from broker.replica_manager import ReplicaManager
from protocol.errors import ErrorCode, KafkaError
from protocol.records import build_batch, decode_records
from storage.log import now_ms
from storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_CONFIGS = {"retention.ms": "-1", "segment.bytes": "104857600"}
_LOAD_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class OffsetsConfig:
    num_partitions: int = 50
    retention_ms: int = 7 * 24 * 3_600_000
    metadata_max_bytes: int = 4096


class GroupMetadataManager:
    def __init__(
        self, replicas: ReplicaManager, controller: Controller, config: OffsetsConfig
    ) -> None:
        self.replicas = replicas
        self.controller = controller
        self.config = config
        self.offsets: dict[str, dict[TopicPartition, OffsetValue]] = {}

    def partition_for(self, group_id: str) -> TopicPartition:
        return TopicPartition(OFFSETS_TOPIC, partition_for(group_id, self.config.num_partitions))

    def ensure_topic(self) -> None:
        """Create `__consumer_offsets` on first use, as Kafka does."""
        if OFFSETS_TOPIC not in self.controller.store.topics:
            self.controller.create_topic(
                OFFSETS_TOPIC, self.config.num_partitions, 1, OFFSETS_TOPIC_CONFIGS
            )

    # Loading -------------------------------------------------------------------------

    def load(self) -> dict[str, GroupValue]:
        """Replay the topic: fills the offsets cache; returns the last metadata of each group."""
        groups: dict[str, GroupValue] = {}
        topic = self.controller.store.topics.get(OFFSETS_TOPIC)
        if topic is None:
            return groups
        for p in range(topic.partitions):
            for key_bytes, value in self._read_partition(TopicPartition(OFFSETS_TOPIC, p)):
                key = decode_key(key_bytes)
                if isinstance(key, OffsetKey):
                    tp = TopicPartition(key.topic, key.partition)
                    if value is None:
                        self.offsets.get(key.group, {}).pop(tp, None)
                    else:
                        self.offsets.setdefault(key.group, {})[tp] = decode_offset_value(value)
                elif isinstance(key, GroupKey):
                    if value is None:
                        groups.pop(key.group, None)
                    else:
                        groups[key.group] = decode_group_value(value)
        self.offsets = {g: o for g, o in self.offsets.items() if o}
        return groups

    def _read_partition(self, tp: TopicPartition) -> Iterable[tuple[bytes, bytes | None]]:
        partition = self.replicas.partition_or_error(tp)
        log_ = partition.log
        offset = log_.log_start_offset
        while offset < log_.high_watermark:
            data = log_.read(offset, _LOAD_READ_BYTES, log_.high_watermark, min_one_batch=True)
            if data.records is None:
                return
            last = offset - 1
            for record in decode_records(data.records.read()):
                if record.offset >= offset and record.key is not None:
                    yield record.key, record.value
                last = record.offset
            if last < offset:
                return
            offset = last + 1

    # Writing -------------------------------------------------------------------------

    def _append(self, group_id: str, records: list[tuple[bytes, bytes | None]]) -> None:
        """Append records to the group's partition; raise with the code a client should see."""
        timestamp = now_ms()
        batch = build_batch([(key, value, [], timestamp) for key, value in records])
        tp = self.partition_for(group_id)
        result = self.replicas.append_records({tp: batch})[tp]
        if result.error == ErrorCode.message_too_large:
            raise KafkaError(
                ErrorCode.invalid_commit_offset_size, f"commit for {group_id} too large"
            )
        if result.error != ErrorCode.none:
            raise KafkaError(
                ErrorCode.coordinator_not_available,
                f"appending to {tp} for group {group_id} failed: {result.error.name}",
            )

    def commit(self, group_id: str, offsets: dict[TopicPartition, OffsetValue]) -> None:
        self._append(
            group_id,
            [
                (encode_key(OffsetKey(group_id, tp.topic, tp.partition)), encode_offset_value(v))
                for tp, v in offsets.items()
            ],
        )
        self.offsets.setdefault(group_id, {}).update(offsets)

    def store_group(self, group_id: str, value: GroupValue) -> None:
        self._append(group_id, [(encode_key(GroupKey(group_id)), encode_group_value(value))])

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        partitions = [tp for tp in partitions if tp in self.offsets.get(group_id, {})]
        if not partitions:
            return
        self._append(
            group_id,
            [(encode_key(OffsetKey(group_id, tp.topic, tp.partition)), None) for tp in partitions],
        )
        group_offsets = self.offsets[group_id]
        for tp in partitions:
            del group_offsets[tp]
        if not group_offsets:
            del self.offsets[group_id]

    def delete_group(self, group_id: str) -> None:
        """Tombstones for the group's metadata and every offset it committed."""
        self.delete_offsets(group_id, list(self.offsets.get(group_id, {})))
        self._append(group_id, [(encode_key(GroupKey(group_id)), None)])

    def fetch(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, OffsetValue | None]:
        committed = self.offsets.get(group_id, {})
        if partitions is None:
            return dict(committed)
        return {tp: committed.get(tp) for tp in partitions}

    def expired_offsets(
        self, group_id: str, empty_since_ms: int | None, now: int
    ) -> list[TopicPartition]:
        """Offsets to expire: all of an empty group past retention, or standalone ones past it."""
        committed = self.offsets.get(group_id, {})
        if empty_since_ms is not None:
            return list(committed) if empty_since_ms + self.config.retention_ms < now else []
        return [
            tp
            for tp, v in committed.items()
            if v.commit_timestamp_ms + self.config.retention_ms < now
        ]
