"""`TransactionStateManager`: the transactional ids this broker coordinates, kept in
`__transaction_state` (Kafka's `TransactionStateManager`).

The coordinator of a transactional id is the leader of its partition of the topic; its
coordinator epoch is that partition's leader epoch. A new leader replays the partition
(`load_partition`) before it answers, and forgets its ids when it stops leading it. A
change of state is written with acks=all and applied only once written (`write`); an
append that fails is answered with the code Kafka maps it to. The topic is compacted:
an expired id leaves a tombstone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from tierbroker.broker.coordinator.group.records import partition_for
from tierbroker.broker.coordinator.internal_topic import InternalTopic
from tierbroker.broker.coordinator.transaction.metadata import (
    TransactionMetadata,
    TxnTransitMetadata,
)
from tierbroker.broker.coordinator.transaction.records import (
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from tierbroker.broker.metadata.topic_admin import TopicAdmin
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    num_partitions: int = 50  # transaction.state.log.num.partitions
    replication_factor: int = 3  # capped at the live brokers when the topic is created
    min_isr: int = 2  # transaction.state.log.min.isr, capped at the replication factor
    segment_bytes: int = 104_857_600  # transaction.state.log.segment.bytes
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_interval_ms: int = 3_600_000
    request_timeout_ms: int = 30_000
    transaction_version: int = 2  # the feature level finalized: 2 bumps epochs (KIP-890)


class TransactionStateManager:
    def __init__(
        self, replicas: ReplicaManager, admin: TopicAdmin, config: TransactionConfig
    ) -> None:
        self.config = config
        self.topic = InternalTopic(
            TRANSACTION_STATE_TOPIC,
            config.num_partitions,
            config.replication_factor,
            {
                "cleanup.policy": "compact",
                "compression.type": "uncompressed",
                "unclean.leader.election.enable": "false",
                "segment.bytes": str(config.segment_bytes),
            },
            replicas,
            admin,
            config.request_timeout_ms,
        )
        self.metadata: dict[str, TransactionMetadata] = {}
        self.owned: dict[int, int] = {}  # partition -> coordinator epoch
        self.loading: set[int] = set()
        self._changed = asyncio.Event()  # set, then replaced, when a written change settles

    async def changed(self, timeout_s: float) -> None:
        """Wait until some transactional id's pending change is written or dropped, or
        `timeout_s` passes."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    def _settled(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def ensure_topic(self) -> None:
        """Create `__transaction_state` on first use, its min ISR at most its replicas."""
        if not self.topic.exists:
            live = len(self.topic.admin.cache.brokers)
            replicas = min(self.config.replication_factor, max(live, 1))
            self.topic.configs["min.insync.replicas"] = str(min(self.config.min_isr, replicas))
        await self.topic.ensure_created()

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.topic.num_partitions)

    def coordinator_error(self, transactional_id: str) -> ErrorCode:
        """NONE if this broker coordinates `transactional_id` now, else the client's code."""
        partition = self.partition_of(transactional_id)
        if partition in self.loading:
            return ErrorCode.coordinator_load_in_progress
        if partition not in self.owned:
            return ErrorCode.not_coordinator
        return ErrorCode.none

    def hosts(self, partition: int) -> bool:
        """Whether this broker loads or owns the ids of `partition`."""
        return partition in self.owned or partition in self.loading

    def coordinator_epoch(self, transactional_id: str) -> int | None:
        return self.owned.get(self.partition_of(transactional_id))

    # Loading -------------------------------------------------------------------------

    def load_partition(self, partition: int, coordinator_epoch: int) -> list[TransactionMetadata]:
        """Replay one partition and own it; the transactions it left prepared, whose
        markers the new coordinator sends again."""
        self.unload_partition(partition)
        started = time.monotonic()
        loaded: dict[str, TransactionMetadata] = {}
        replayed = 0
        for _, key, value in self.topic.read(partition, to_log_end=True):
            replayed += 1
            transactional_id = decode_key(key)
            if value is None:
                loaded.pop(transactional_id, None)
                continue
            v = decode_value(value)
            loaded[transactional_id] = TransactionMetadata(
                transactional_id=transactional_id,
                producer_id=v.producer_id,
                producer_epoch=v.producer_epoch,
                timeout_ms=v.timeout_ms,
                state=v.state,
                partitions=set(v.partitions),
                start_ms=v.start_ms,
                last_update_ms=v.last_update_ms,
                last_producer_id=v.previous_producer_id,
                next_producer_id=v.next_producer_id,
                client_transaction_version=v.client_transaction_version,
            )
        self.metadata.update(loaded)
        self.loading.discard(partition)
        self.owned[partition] = coordinator_epoch
        log.log(
            logging.INFO if loaded else logging.DEBUG,
            "loaded %s-%d at coordinator epoch %d: %d transactional ids from %d records in %.0f ms",
            TRANSACTION_STATE_TOPIC,
            partition,
            coordinator_epoch,
            len(loaded),
            replayed,
            (time.monotonic() - started) * 1000,
        )
        return [m for m in loaded.values() if m.state.is_prepare]

    def unload_partition(self, partition: int) -> None:
        self.owned.pop(partition, None)
        for transactional_id in [t for t in self.metadata if self.partition_of(t) == partition]:
            del self.metadata[transactional_id]

    # Writing -------------------------------------------------------------------------

    async def write(
        self, metadata: TransactionMetadata, transit: TxnTransitMetadata, coordinator_epoch: int
    ) -> None:
        """Write `transit` and apply it; on failure, drop it and raise with the client's code:
        NOT_COORDINATOR if the partition moved (before or during the write),
        COORDINATOR_NOT_AVAILABLE if its ISR did not take it, UNKNOWN_SERVER_ERROR if too
        large (Kafka's mapping)."""
        transactional_id = metadata.transactional_id
        value = TransactionLogValue(
            transit.producer_id,
            transit.producer_epoch,
            transit.timeout_ms,
            transit.state,
            transit.partitions,
            transit.last_update_ms,
            transit.start_ms,
            transit.last_producer_id,
            transit.next_producer_id,
            transit.client_transaction_version,
        )
        # Kafka writes the flexible value from transaction.version 1 on.
        version = 1 if self.config.transaction_version >= 1 else 0
        try:
            await self.topic.append_records(
                self.partition_of(transactional_id),
                [(encode_key(transactional_id), encode_value(value, version))],
            )
        except KafkaError as e:
            metadata.pending_state = None
            self._settled()
            raise KafkaError(_client_code(e.code), f"{transactional_id}: {e}") from e
        if self.coordinator_epoch(transactional_id) != coordinator_epoch:
            metadata.pending_state = None
            self._settled()
            raise KafkaError(
                ErrorCode.not_coordinator, f"{transactional_id}: the coordinator moved meanwhile"
            )
        metadata.complete_transition(transit)
        self._settled()

    async def remove(self, metadata: TransactionMetadata, coordinator_epoch: int) -> None:
        """Expire an idle transactional id: a tombstone, then forget it."""
        transactional_id = metadata.transactional_id
        try:
            await self.topic.append_records(
                self.partition_of(transactional_id), [(encode_key(transactional_id), None)]
            )
        finally:
            metadata.pending_state = None
        if self.coordinator_epoch(transactional_id) == coordinator_epoch:
            self.metadata.pop(transactional_id, None)


def _client_code(code: ErrorCode) -> ErrorCode:
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition):
        return ErrorCode.not_coordinator
    if code == ErrorCode.message_too_large or code == ErrorCode.record_list_too_large:
        return ErrorCode.unknown_server_error
    return ErrorCode.coordinator_not_available
