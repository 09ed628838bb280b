"""`GroupMetadataManager`: committed offsets and group metadata, kept in `__consumer_offsets`.

Every commit and every completed rebalance is appended to the group's partition of
`__consumer_offsets` (see `records` for the formats), and acknowledged or cached only
once the partition's ISR has it (acks=all), so a coordinator that moves to another
broker, or a restart, rebuilds the same state by replaying that partition. The broker
leading a partition loads it (`load_partition`) and coordinates its groups; one that
stops leading it forgets them (`unload_partition`). The topic is compacted, as in
Kafka: a load replays about one record a live key. Offsets of a group with no members
expire `offsets.retention.minutes` after the group became empty (KIP-211); their
removal is written as tombstones, which the cleaner drops after
`delete.retention.ms`.

Offsets committed in a transaction (TxnOffsetCommit) are written in the producer's
transaction and held pending, per producer, until its marker on the partition: COMMIT
makes them the group's committed offsets, ABORT drops them (Kafka's
pendingTransactionalOffsetCommits); a load holds them the same way until it meets the marker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from tierbroker.broker.coordinator.group.records import (
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
from tierbroker.broker.coordinator.internal_topic import InternalTopic
from tierbroker.broker.metadata.topic_admin import TopicAdmin
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.broker.replication.transaction_verification import (
    TRANSACTION_ERRORS,
    TransactionSupportedOperation,
)
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records.control import read_end_txn_marker
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_CONFIGS = {"cleanup.policy": "compact", "compression.type": "producer"}


@dataclass(frozen=True, slots=True)
class OffsetsConfig:
    num_partitions: int = 50
    replication_factor: int = 3  # capped at the live brokers when the topic is created
    retention_ms: int = 7 * 24 * 3_600_000
    metadata_max_bytes: int = 4096
    commit_timeout_ms: int = 5000  # offsets.commit.timeout.ms
    segment_bytes: int = 104_857_600  # offsets.topic.segment.bytes


class GroupMetadataManager:
    def __init__(self, replicas: ReplicaManager, admin: TopicAdmin, config: OffsetsConfig) -> None:
        self.topic = InternalTopic(
            OFFSETS_TOPIC,
            config.num_partitions,
            config.replication_factor,
            {**OFFSETS_TOPIC_CONFIGS, "segment.bytes": str(config.segment_bytes)},
            replicas,
            admin,
            config.commit_timeout_ms,
        )
        self.config = config
        self.offsets: dict[str, dict[TopicPartition, OffsetValue]] = {}
        # producer id -> group -> the offsets its open transaction commits
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetValue]]] = {}

    async def ensure_topic(self) -> None:
        """Create `__consumer_offsets` on first use, as Kafka does."""
        await self.topic.ensure_created()

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.topic.num_partitions)

    # Loading -------------------------------------------------------------------------

    def load_partition(self, partition: int) -> dict[str, GroupValue]:
        """Replay one partition of the topic: fills the offsets cache of its groups; returns
        the last metadata of each."""
        groups: dict[str, GroupValue] = {}
        self.unload_partition(partition)
        started = time.monotonic()
        replayed = 0
        # To the log end: a new leader may not know the high watermark the old one had
        # reached, and what it holds is what it serves from now on.
        for batch, records in self.topic.read_batches(partition, to_log_end=True):
            if batch.is_control:
                marker = read_end_txn_marker(batch)
                if marker is not None:
                    self._complete(partition, batch.producer_id, not marker.is_abort)
                continue
            for _, key_bytes, value in records:
                replayed += 1
                key = decode_key(key_bytes)
                if isinstance(key, OffsetKey):
                    tp = TopicPartition(key.topic, key.partition)
                    if batch.is_transactional and value is not None:
                        self.pending.setdefault(batch.producer_id, {}).setdefault(key.group, {})[
                            tp
                        ] = decode_offset_value(value)
                    elif value is None:
                        self.offsets.get(key.group, {}).pop(tp, None)
                    else:
                        self.offsets.setdefault(key.group, {})[tp] = decode_offset_value(value)
                elif isinstance(key, GroupKey):
                    if value is None:
                        groups.pop(key.group, None)
                    else:
                        groups[key.group] = decode_group_value(value)
        self.offsets = {g: o for g, o in self.offsets.items() if o}
        log.info(
            "loaded %s-%d: %d records replayed in %.0f ms",
            OFFSETS_TOPIC,
            partition,
            replayed,
            (time.monotonic() - started) * 1000,
        )
        return groups

    def unload_partition(self, partition: int) -> None:
        for group_id in [g for g in self.offsets if self.partition_of(g) == partition]:
            del self.offsets[group_id]
        for producer_id in list(self.pending):
            groups = self.pending[producer_id]
            for group_id in [g for g in groups if self.partition_of(g) == partition]:
                del groups[group_id]
            if not groups:
                del self.pending[producer_id]

    # Transactions --------------------------------------------------------------------

    async def commit_transactional(
        self,
        group_id: str,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: dict[TopicPartition, OffsetValue],
        operation: TransactionSupportedOperation,
    ) -> None:
        """TxnOffsetCommit: write the offsets in the producer's transaction; pending until
        its marker. What its coordinator answers is the client's error as it is."""
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(OffsetKey(group_id, tp.topic, tp.partition)), encode_offset_value(v))
            for tp, v in offsets.items()
        ]
        try:
            await self.topic.append_transactional(
                self.partition_of(group_id),
                records,
                transactional_id,
                producer_id,
                producer_epoch,
                operation,
            )
        except KafkaError as e:
            code = e.code if e.code in TRANSACTION_ERRORS else _commit_error_code(e.code)
            raise KafkaError(code, f"group {group_id}: {e}") from e
        self.pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(offsets)

    def complete_transaction(self, partition: int, producer_id: int, committed: bool) -> None:
        """The producer's marker was written to `partition`: its pending offsets there count
        (COMMIT) or go (ABORT)."""
        self._complete(partition, producer_id, committed)

    def _complete(self, partition: int, producer_id: int, committed: bool) -> None:
        groups = self.pending.get(producer_id)
        if not groups:
            return
        for group_id in [g for g in groups if self.partition_of(g) == partition]:
            offsets = groups.pop(group_id)
            if committed:
                self.offsets.setdefault(group_id, {}).update(offsets)
        if not groups:
            del self.pending[producer_id]

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        """An open transaction commits an offset of `tp` for the group (RequireStable)."""
        return any(tp in groups.get(group_id, {}) for groups in self.pending.values())

    # Writing -------------------------------------------------------------------------

    async def _append(
        self,
        group_id: str,
        records: list[tuple[bytes, bytes | None]],
        too_large: ErrorCode = ErrorCode.invalid_commit_offset_size,
    ) -> None:
        """Append to the group's partition and wait for its ISR; raise with the code a
        client should see, as Kafka maps them: a batch too large is INVALID_COMMIT_OFFSET_SIZE
        for a commit and UNKNOWN_SERVER_ERROR for group metadata; a partition no longer led
        here is NOT_COORDINATOR; a write the ISR did not take in time is REQUEST_TIMED_OUT;
        any other failure COORDINATOR_NOT_AVAILABLE."""
        try:
            await self.topic.append_records(self.partition_of(group_id), records)
        except KafkaError as e:
            if e.code == ErrorCode.message_too_large:
                raise KafkaError(too_large, f"records of group {group_id} too large") from e
            raise KafkaError(_commit_error_code(e.code), f"group {group_id}: {e}") from e

    async def commit(self, group_id: str, offsets: dict[TopicPartition, OffsetValue]) -> None:
        await self._append(
            group_id,
            [
                (encode_key(OffsetKey(group_id, tp.topic, tp.partition)), encode_offset_value(v))
                for tp, v in offsets.items()
            ],
        )
        self.offsets.setdefault(group_id, {}).update(offsets)

    async def store_group(self, group_id: str, value: GroupValue) -> None:
        await self._append(
            group_id,
            [(encode_key(GroupKey(group_id)), encode_group_value(value))],
            too_large=ErrorCode.unknown_server_error,
        )

    async def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        partitions = [tp for tp in partitions if tp in self.offsets.get(group_id, {})]
        if not partitions:
            return
        await self._append(
            group_id,
            [(encode_key(OffsetKey(group_id, tp.topic, tp.partition)), None) for tp in partitions],
        )
        group_offsets = self.offsets[group_id]
        for tp in partitions:
            del group_offsets[tp]
        if not group_offsets:
            del self.offsets[group_id]

    async def delete_group(self, group_id: str) -> None:
        """Tombstones for the group's metadata and every offset it committed."""
        await self.delete_offsets(group_id, list(self.offsets.get(group_id, {})))
        await self._append(group_id, [(encode_key(GroupKey(group_id)), None)])

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


def _commit_error_code(code: ErrorCode) -> ErrorCode:
    """A failed append as a client sees it: a partition no longer led here is
    NOT_COORDINATOR, one too large INVALID_COMMIT_OFFSET_SIZE, a write the ISR did not take
    in time REQUEST_TIMED_OUT, any other COORDINATOR_NOT_AVAILABLE."""
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition):
        return ErrorCode.not_coordinator
    if code == ErrorCode.message_too_large:
        return ErrorCode.invalid_commit_offset_size
    if code == ErrorCode.request_timed_out:
        return code
    return ErrorCode.coordinator_not_available
