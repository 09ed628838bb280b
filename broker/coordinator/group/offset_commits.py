"""`GroupOffsets`: the committed offsets of the groups a `GroupCoordinator` owns.

TxnOffsetCommit writes offsets in a producer's transaction (see `GroupMetadataManager`).

OffsetCommit is checked against the group's members and generation (a consumer that
assigns its own partitions commits with generation -1 to an empty group), OffsetDelete
refuses partitions of topics the members subscribe to, DeleteGroups only empty groups,
and offsets past offsets.retention.minutes expire once their group is empty (KIP-211).
As in Kafka's GroupCoordinator, the stored records go through the `GroupMetadataManager`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tierbroker.broker.coordinator.group.group import GroupMetadata, GroupState
from tierbroker.broker.coordinator.group.offsets_store import GroupMetadataManager
from tierbroker.broker.coordinator.group.records import OffsetValue
from tierbroker.broker.replication.transaction_verification import TransactionSupportedOperation
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log import now_ms
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

Empty, Completing = GroupState.EMPTY, GroupState.COMPLETING_REBALANCE


class GroupOffsets:
    def __init__(
        self,
        store: GroupMetadataManager,
        groups: dict[str, GroupMetadata],
        topic_exists: Callable[[TopicPartition], bool],
        coordinator_error: Callable[[str], ErrorCode],
    ) -> None:
        """`groups`: the coordinator's, shared; `coordinator_error`: NONE where this broker
        coordinates a group now, else the error its clients are told."""
        self.store = store
        self.groups = groups
        self.topic_exists = topic_exists
        self.coordinator_error = coordinator_error

    async def commit(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: dict[TopicPartition, OffsetValue],
    ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit: each partition's error; a group first seen here is created empty."""
        error = self._commit_error(group_id, member_id, group_instance_id, generation_id)
        if error != ErrorCode.none:
            return dict.fromkeys(offsets, error)
        results: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, OffsetValue] = {}
        for tp, value in offsets.items():
            if not self.topic_exists(tp):
                results[tp] = ErrorCode.unknown_topic_or_partition
            elif len(value.metadata.encode()) > self.store.config.metadata_max_bytes:
                results[tp] = ErrorCode.offset_metadata_too_large
            else:
                valid[tp] = value
        if valid:
            try:
                await self.store.commit(group_id, valid)
                results.update(dict.fromkeys(valid, ErrorCode.none))
            except KafkaError as e:
                results.update(dict.fromkeys(valid, e.code))
        self.groups.setdefault(group_id, GroupMetadata(group_id, state_timestamp_ms=now_ms()))
        return results

    async def commit_transactional(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: dict[TopicPartition, OffsetValue],
        operation: TransactionSupportedOperation,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: each partition's error. A consumer's group metadata, when sent
        (v3+, KIP-447), must be the group's current member and generation; without it
        (older clients) any producer may commit, as in Kafka. The transaction's
        coordinator checks (or, `operation` ADD_PARTITION, adds) the group's partition."""
        if not group_id:
            return dict.fromkeys(offsets, ErrorCode.invalid_group_id)
        error = self.coordinator_error(group_id)
        if error == ErrorCode.none:
            group = self.groups.setdefault(
                group_id, GroupMetadata(group_id, state_timestamp_ms=now_ms())
            )
            if generation_id >= 0 or member_id or group_instance_id is not None:
                error = self._member_error(group, member_id, group_instance_id)
                if error == ErrorCode.none and generation_id != group.generation_id:
                    error = ErrorCode.illegal_generation
        if error != ErrorCode.none:
            return dict.fromkeys(offsets, error)
        results = {
            tp: ErrorCode.unknown_topic_or_partition for tp in offsets if not self.topic_exists(tp)
        }
        valid = {tp: v for tp, v in offsets.items() if tp not in results}
        if valid:
            try:
                await self.store.commit_transactional(
                    group_id, transactional_id, producer_id, producer_epoch, valid, operation
                )
                results.update(dict.fromkeys(valid, ErrorCode.none))
            except KafkaError as e:
                results.update(dict.fromkeys(valid, e.code))
        return results

    @staticmethod
    def _member_error(
        group: GroupMetadata, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        """Kafka's validateCurrentMember: the member, or a static one's current id."""
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member.group_instance_id != group_instance_id:
            return ErrorCode.fenced_instance_id
        return ErrorCode.none

    def _commit_error(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        error = self.coordinator_error(group_id)
        if error != ErrorCode.none:
            return error
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none if generation_id < 0 else ErrorCode.illegal_generation
        if generation_id < 0 and group.is_in(Empty):
            return ErrorCode.none  # a consumer that assigns its own partitions
        if group.is_in(Completing):
            return ErrorCode.rebalance_in_progress
        error = self._member_error(group, member_id, group_instance_id)
        if error == ErrorCode.none and generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        return error

    async def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: each group's error; only empty groups go, with their offsets."""
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            group = self.groups.get(group_id)
            error = self.coordinator_error(group_id)
            if error != ErrorCode.none:
                results[group_id] = error
            elif group is None:
                results[group_id] = ErrorCode.group_id_not_found
            elif group.members:
                results[group_id] = ErrorCode.non_empty_group
            else:
                try:
                    await self.store.delete_group(group_id)
                except KafkaError as e:
                    results[group_id] = e.code
                    continue
                group.transition_to(GroupState.DEAD, now_ms())
                del self.groups[group_id]
                results[group_id] = ErrorCode.none
        return results

    async def delete(
        self, group_id: str, partitions: list[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: the group's error and each partition's."""
        error = self.coordinator_error(group_id)
        if error != ErrorCode.none:
            return error, {}
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.group_id_not_found, {}
        subscribed = group.subscribed_topics() if group.members else set()
        if subscribed is None:
            return ErrorCode.non_empty_group, {}
        results = {
            tp: ErrorCode.group_subscribed_to_topic if tp.topic in subscribed else ErrorCode.none
            for tp in partitions
        }
        try:
            await self.store.delete_offsets(
                group_id, [tp for tp, e in results.items() if e == ErrorCode.none]
            )
        except KafkaError as e:
            return e.code, {}
        return ErrorCode.none, results

    async def expire(self) -> None:
        """Remove offsets past offsets.retention.minutes, and the empty groups left behind."""
        now = now_ms()
        for group_id, group in list(self.groups.items()):
            empty_since = group.state_timestamp_ms if group.is_in(Empty) else None
            if group.members and group.protocol_type:
                continue  # offsets of active groups are kept (KIP-211)
            expired = self.store.expired_offsets(group_id, empty_since, now)
            if expired:
                log.info("group %s: expiring %d committed offsets", group_id, len(expired))
                await self.store.delete_offsets(group_id, expired)
            if (
                group.is_in(Empty)
                and group_id not in self.store.offsets
                and empty_since is not None
                and empty_since + self.store.config.retention_ms < now
            ):
                await self.store.delete_group(group_id)
                self.groups.pop(group_id, None)
