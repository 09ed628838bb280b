"""`ReplicaManager`: the partitions this broker hosts, as leader or follower, and the
appends and reads across them.

It follows the cluster's metadata: each `MetadataDelta` makes partitions leaders or
followers (creating their logs first, a batch at a time, off the event loop), moves
followers between fetchers, and stops replicas no longer assigned here (deleting
their logs). Deltas are applied one at a time, in order, by one task.

Handlers call it with plain values and get plain results back; it decides which
partition answers, what error a partition gets, when a request waits, and when a
read goes to the remote tier. Waiting requests park in purgatories keyed by
partition: acks=all produces until the high watermark passes their last offset,
fetches until min_bytes (or, for a follower, until the high watermark it last saw is
stale). Every change of a log end offset, high watermark or leadership wakes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tierbroker.broker.metadata.metadata_cache import MetadataCache, MetadataDelta
from tierbroker.broker.metadata.store import MetadataStore
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.network.inter_broker import InterBrokerChannel, address_of
from tierbroker.broker.replication.alter_partition import AlterPartitionManager
from tierbroker.broker.replication.fetch_reader import (
    FetchParams,
    FetchReader,
    FetchRequestPartition,
    FetchResultPartition,
)
from tierbroker.broker.replication.leader_appends import LeaderAppends
from tierbroker.broker.replication.partition import (
    DEBUGGING_CONSUMER,
    FollowerFetch,
    OffsetAndEpoch,
    Partition,
)
from tierbroker.broker.replication.purgatory import Purgatory
from tierbroker.broker.replication.replica_fetcher import FetcherConfig, ReplicaFetcherManager
from tierbroker.broker.replication.tier_state_machine import TierStateMachine
from tierbroker.broker.replication.transaction_verification import (
    TransactionSupportedOperation,
    TransactionVerifier,
    producer_error,
)
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BATCH_HEADER_SIZE, BatchView, InvalidRecordError
from tierbroker.protocol.records.control import EndTxnMarker
from tierbroker.protocol.records.validation import RecordValidationError
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.log import (
    CLIENT_APPEND,
    AppendOptions,
    LogStartOffsetIncrementReason,
    now_ms,
)
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.long_lived import LongLivedObjects
from tierbroker.storage.producer_state import VerificationGuard
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.remote.storage_manager import RemoteStorageError
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

FREEZE_EVERY_PARTITIONS = 256  # partitions led between two freezes of the heap
PARTITIONS_PER_TURN = 100  # role changes applied between two turns of the event loop


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    replica_lag_time_max_ms: int = 30_000
    fetcher: FetcherConfig = field(default_factory=FetcherConfig)
    # Complete a follower's parked fetch when the high watermark moves (KIP-392's design;
    # Kafka keeps it for clusters with a replica selector, as KAFKA-9731 decided).
    propagate_high_watermark: bool = False
    inter_broker: InterBrokerChannel = field(default_factory=InterBrokerChannel)


@dataclass(frozen=True, slots=True)
class ProduceResult:
    error: ErrorCode
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()  # (index in the batch, message)


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        log_manager: LogManager,
        cache: MetadataCache,
        store: MetadataStore,
        config: ReplicationConfig | None = None,
        log_config: Callable[[str], LogConfig] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.cache = cache
        self.config = config or ReplicationConfig()
        self.log_config = log_config or (lambda _topic: LogConfig())
        self.partitions: dict[TopicPartition, Partition] = {}
        self.leader_appends = LeaderAppends(self.partition_or_error)
        # Assigned here, but their log could not be created or their role not changed:
        # they answer KAFKA_STORAGE_ERROR, and are tried again at each metadata change.
        self.offline: set[TopicPartition] = set()
        self.fetch_purgatory = Purgatory()
        self.produce_purgatory = Purgatory()
        self.remote: RemoteLogManager | None = None
        self.long_lived = LongLivedObjects(FREEZE_EVERY_PARTITIONS)
        self.broker_epoch = -1  # the czxid of this broker's registration
        self.fenced = False  # its metadata session is gone: a successor may lead
        self.alter_partition = AlterPartitionManager(store, self._on_isr_committed)
        self.fetchers = ReplicaFetcherManager(
            broker_id,
            lambda: self.broker_epoch,
            self.config.fetcher,
            self._on_follower_appended,
            log_manager.free_space,
            self.config.inter_broker,
        )
        self.fetchers.on_storage_error = self._follower_storage_error
        self.reader = FetchReader(
            self.partition_or_error,
            self.partitions,
            cache,
            self.fetch_purgatory,
            self._on_follower_fetch,
        )
        self.reader.propagate_high_watermark = self.config.propagate_high_watermark
        self.leadership_listeners: list[Callable[[Partition, bool], None]] = []
        self.isr_change_listeners: list[Callable[[bool], None]] = []  # (expanded)
        # Called when a partition leaves this broker: (partition, whether its topic was deleted).
        self.stop_listeners: list[Callable[[TopicPartition, bool], None]] = []
        # Called when a partition's log end or high watermark may have moved.
        self.progress_listeners: list[Callable[[TopicPartition], None]] = []
        # (partition, producer id, marker) of each end-transaction marker written and replicated
        self.txn_marker_listeners: list[Callable[[TopicPartition, int, EndTxnMarker], None]] = []
        # KIP-890: asks a transaction's coordinator whether it has (or to add) these partitions
        self.verify_transaction: TransactionVerifier | None = None
        self._deltas: asyncio.Queue[MetadataDelta] = asyncio.Queue()
        self._applier: asyncio.Task[None] | None = None
        self.applied = asyncio.Event()  # set whenever the queue of deltas is drained

    # Following the metadata ----------------------------------------------------------

    async def start(self) -> None:
        """Take every partition the metadata assigns here, delete logs it does not, then
        follow the metadata's changes."""
        full = MetadataDelta(partitions=dict(self.cache.states), brokers_changed=True)
        for tp in list(self.log_manager.logs):
            if self.broker_id not in self.cache.replicas(tp):
                full.partitions.setdefault(tp, None)
        await self._apply(full)
        self.cache.add_listener(self._enqueue)
        self._applier = asyncio.get_running_loop().create_task(
            self._apply_deltas(), name=f"replica-manager-{self.broker_id}"
        )

    def _enqueue(self, delta: MetadataDelta) -> None:
        self.applied.clear()
        self._deltas.put_nowait(delta)

    async def _apply_deltas(self) -> None:
        while True:
            if self._deltas.empty():
                self.applied.set()
            delta = await self._deltas.get()
            try:
                await self._apply(delta)
            except KafkaError as e:  # a log that could not be created: its dir is offline
                log.warning("broker %d: metadata change not applied whole: %s", self.broker_id, e)
            except Exception:
                log.exception("broker %d: applying a metadata change failed", self.broker_id)

    async def _apply(self, delta: MetadataDelta) -> None:
        """Apply `delta` partition by partition, as Kafka's makeLeaders / makeFollowers: one
        that fails goes offline here and the others still change role."""
        changes = {tp: self.cache.states.get(tp) for tp in self.offline}  # tried again
        changes.update(delta.partitions)
        failed = await self._create_logs(changes)
        for done, (tp, state) in enumerate(changes.items(), 1):
            if done % PARTITIONS_PER_TURN == 0:
                await asyncio.sleep(0)  # requests are served between slices of a large change
            replicas = self.cache.replicas(tp)
            try:
                if state is None or self.broker_id not in replicas:
                    # Only a deleted topic takes its remote data along (Kafka's
                    # deleteRemoteLog): a replica moved elsewhere leaves the remote tier to them.
                    self.stop_replica(
                        tp, delete=True, delete_remote=tp.topic in delta.deleted_topics
                    )
                elif tp in self.log_manager.logs and tp not in failed:
                    self._become(tp, state, replicas)
                    self.offline.discard(tp)
            except Exception as e:
                failed[tp] = e
        for tp, error in failed.items():
            self._take_offline(tp, error)
        # A dynamic broker config changes the defaults of every topic.
        changed = set(self.cache.topics) if delta.broker_configs_changed else delta.configs_changed
        for topic in changed:
            config = self.log_config(topic)
            for p in range(self.cache.partition_count(topic)):
                self.update_config(TopicPartition(topic, p), config)
        if delta.brokers_changed:
            self._refetch_from_new_endpoints()

    def _follower_storage_error(self, partition: Partition, error: OSError) -> bool:
        """The failure channel decides: True if the follower's log dir is offline now."""
        return self.log_manager.failure_channel.maybe_add_offline_log_dir(
            partition.log.dir.parent, error, f"appending to {partition.topic_partition}"
        )

    def _take_offline(self, tp: TopicPartition, error: Exception) -> None:
        if tp not in self.offline:  # logged once, not at every retry
            log.error("broker %d: %s is offline here: %r", self.broker_id, tp, error)
        self.offline.add(tp)
        self.fetchers.remove(tp)
        self._wake(tp)

    async def _create_logs(
        self, changes: dict[TopicPartition, PartitionState | None]
    ) -> dict[TopicPartition, Exception]:
        """Create, off the event loop, the logs of partitions new here: a batch per topic
        and role (a new leader's log starts with its epoch; a follower's takes the epochs
        of what it fetches). A batch that fails is created again one log at a time; the
        logs that still fail are returned with their error."""
        new: defaultdict[tuple[str, int | None], list[TopicPartition]] = defaultdict(list)
        for tp, state in changes.items():
            if (
                state is not None
                and tp not in self.log_manager.logs
                and self.broker_id in self.cache.replicas(tp)
            ):
                epoch = state.leader_epoch if state.leader == self.broker_id else None
                new[tp.topic, epoch].append(tp)
        failed: dict[TopicPartition, Exception] = {}
        for (topic, epoch), tps in new.items():
            assignment = self.cache.topics.get(topic)
            if assignment is None:
                continue
            config = self.log_config(topic)
            try:
                await self.log_manager.create_logs(tps, assignment.topic_id, config, epoch)
                continue
            except Exception:
                pass  # which of them fail is found one at a time
            for tp in tps:
                if tp in self.log_manager.logs:
                    continue
                try:
                    await self.log_manager.create_logs([tp], assignment.topic_id, config, epoch)
                except Exception as e:
                    failed[tp] = e
        return failed

    def _become(self, tp: TopicPartition, state: PartitionState, replicas: tuple[int, ...]) -> None:
        partition = self.partitions.get(tp)
        if partition is None:
            partition = Partition(
                self.log_manager.logs[tp],
                self.broker_id,
                self.config.replica_lag_time_max_ms,
                self._is_isr_eligible,
            )
            self.partitions[tp] = partition
            self.long_lived.added()
        elif partition.is_stale(state):
            return
        was_leader = partition.is_leader
        if state.leader == self.broker_id:
            known = set(partition.replicas)
            if partition.make_leader(state, replicas):
                self.fetchers.remove(tp)
                log.debug("%s: leader in epoch %d, ISR %s", tp, state.leader_epoch, list(state.isr))
                self._leadership_changed(partition, True)
            self._wake(tp)
            # A replica new to the partition (a reassignment) asks for it in its next fetch.
            for broker_id in partition.remote_replicas.keys() - known:
                self.reader.wake_follower(broker_id, tp)
            return
        if partition.make_follower(state, replicas) or was_leader:
            self.fetchers.remove(tp)
            self._leadership_changed(partition, False)
            self._wake(tp)
            leader = address_of(self.cache, self.config.inter_broker, state.leader)
            if leader is not None:
                self.fetchers.add(partition, state.leader, leader.host, leader.port)
            log.debug("%s: follower of %d in epoch %d", tp, state.leader, state.leader_epoch)

    def _leadership_changed(self, partition: Partition, leader: bool) -> None:
        tip = TopicIdPartition(partition.topic_id, partition.topic_partition)
        if self.remote is not None:
            if leader:
                self.remote.on_leadership(tip, partition.log)
            else:
                self.remote.on_following(tip, partition.log)
        for listener in self.leadership_listeners:
            listener(partition, leader)

    def _refetch_from_new_endpoints(self) -> None:
        """Followers whose leader registered (again, perhaps elsewhere) fetch from it."""
        for tp, partition in self.partitions.items():
            if partition.is_leader:
                continue
            leader = address_of(self.cache, self.config.inter_broker, partition.leader_id)
            if leader is None:
                self.fetchers.remove(tp)
                continue
            if self.fetchers.endpoint_of(tp) != (partition.leader_id, leader.host, leader.port):
                self.fetchers.add(partition, partition.leader_id, leader.host, leader.port)

    def attach_remote_log_manager(self, remote: RemoteLogManager) -> None:
        """Tiering starts: hand every partition led so far to the RemoteLogManager."""
        self.remote = remote
        self.reader.remote = remote
        self.fetchers.start_tiering(
            TierStateMachine(
                remote.rlmm, remote.rsm, remote.metrics, remote.config.remote_call_timeout_ms
            )
        )
        for tp, partition in self.partitions.items():
            tip = TopicIdPartition(partition.topic_id, tp)
            if partition.is_leader:
                remote.on_leadership(tip, partition.log)
            else:
                remote.on_following(tip, partition.log)
        self.long_lived.freeze()

    def stop_replica(self, tp: TopicPartition, delete: bool, delete_remote: bool = False) -> None:
        """Stop hosting `tp`; `delete`: its local log goes, `delete_remote`: its remote data."""
        self.fetchers.remove(tp)
        self.offline.discard(tp)
        partition = self.partitions.pop(tp, None)
        if partition is not None and self.remote is not None:
            self.remote.on_stop(TopicIdPartition(partition.topic_id, tp), delete_remote)
        if partition is not None and partition.is_leader:
            for listener in self.leadership_listeners:
                listener(partition, False)
        if delete:
            self.log_manager.delete_log(tp)
        for stopped in self.stop_listeners:
            stopped(tp, delete_remote)
        self._wake(tp)

    def on_log_dir_offline(self, log_dir: Path) -> None:
        """Stop fetching the dir's partitions; wake requests waiting on them: they now answer
        KAFKA_STORAGE_ERROR."""
        self.fetchers.remove_log_dir(log_dir)
        for tp, partition in self.partitions.items():
            if partition.log.dir.parent == log_dir:
                self._wake(tp)

    def update_config(self, tp: TopicPartition, config: LogConfig) -> None:
        partition = self.partitions.get(tp)
        if partition is not None:
            partition.log.config = config
            if self.remote is not None:
                self.remote.config_changed(TopicIdPartition(partition.topic_id, tp))

    def _wake(self, tp: TopicPartition) -> None:
        self.fetch_purgatory.notify(tp)
        self.produce_purgatory.notify(tp)
        for listener in self.progress_listeners:
            listener(tp)

    def partition_or_error(self, tp: TopicPartition) -> Partition:
        """The partition, if hosted here and its log dir is online (else KAFKA_STORAGE_ERROR)."""
        partition = self.partitions.get(tp)
        if tp in self.offline:
            raise KafkaError(ErrorCode.kafka_storage_error, f"{tp} is offline on this broker")
        if partition is None:
            known = tp.topic in self.cache.topics and tp.partition < self.cache.partition_count(
                tp.topic
            )
            raise KafkaError(
                ErrorCode.not_leader_or_follower if known else ErrorCode.unknown_topic_or_partition,
                f"{tp} is not hosted by broker {self.broker_id}",
            )
        if not self.log_manager.is_online(partition.log):
            raise KafkaError(
                ErrorCode.kafka_storage_error,
                f"{tp}: log dir {partition.log.dir.parent} is offline",
            )
        return partition

    def fence(self) -> None:
        """Acknowledge no acks=all write until `unfence`: this broker may no longer lead."""
        self.fenced = True
        for tp in self.partitions:
            self.produce_purgatory.notify(tp)

    def unfence(self) -> None:
        self.fenced = False

    # The ISR -------------------------------------------------------------------------

    def _is_isr_eligible(self, broker_id: int, broker_epoch: int = -1) -> bool:
        """Registered and not shutting down (Kafka's KIP-841): a broker whose controlled
        shutdown took it out of the ISR must not be put back while it still fetches. And,
        given the broker epoch a fetch named, registered under that epoch (KIP-903): a fetch
        its previous incarnation left waiting here must not put back a restarted broker,
        whose log may now be empty."""
        registration = self.cache.brokers.get(broker_id)
        return (
            registration is not None
            and broker_id not in self.cache.shutting_down
            and (broker_epoch < 0 or registration.epoch < 0 or registration.epoch == broker_epoch)
        )

    def maybe_shrink_isr(self) -> None:
        """Drop followers that stopped catching up from the ISR of every partition led here
        (every replica.lag.time.max.ms / 2, as Kafka's isr-expiration task)."""
        now = now_ms()
        for partition in self.partitions.values():
            shrunk = partition.isr_shrink(now)
            if shrunk is not None:
                log.info(
                    "%s: shrinking ISR %s to %s (lagging more than %d ms)",
                    partition.topic_partition,
                    sorted(partition.isr),
                    sorted(shrunk),
                    self.config.replica_lag_time_max_ms,
                )
                self.alter_partition.submit(partition, shrunk)

    def _on_isr_committed(self, partition: Partition, expanded: bool) -> None:
        partition.maybe_increment_leader_hw(now_ms())
        self._wake(partition.topic_partition)
        for listener in self.isr_change_listeners:
            listener(expanded)

    def _on_follower_appended(self, partitions: list[Partition]) -> None:
        for partition in partitions:
            self._wake(partition.topic_partition)

    # Produce -------------------------------------------------------------------------

    async def append_records(
        self,
        entries: dict[TopicPartition, bytes],
        required_acks: int = 1,
        timeout_ms: int = 0,
        options: AppendOptions = CLIENT_APPEND,
        operation: TransactionSupportedOperation = TransactionSupportedOperation.DEFAULT_ERROR,
    ) -> dict[TopicPartition, ProduceResult]:
        """Append to each partition as leader; with acks=all, wait until the ISR has the
        records (or `timeout_ms`). Errors stay per partition. `operation`: what the request
        allows when a transaction's first batch to a partition is checked.

        An append that fails on I/O (ENOSPC, EIO) left nothing behind; it is answered
        KAFKA_STORAGE_ERROR and takes its log dir offline.
        """
        results: dict[TopicPartition, ProduceResult] = {}
        waiting: dict[TopicPartition, int] = {}  # partition -> the offset the HW must pass
        per_partition = await self._verified(entries, options, operation, results)
        for tp, records in entries.items():
            if tp in results:
                continue  # refused by the transaction's coordinator
            partition: Partition | None = None
            if required_acks == -1 and self.fenced:
                results[tp] = ProduceResult(
                    ErrorCode.not_leader_or_follower,
                    error_message=f"broker {self.broker_id} lost its metadata session",
                )
                continue
            try:
                partition = self.partition_or_error(tp)
                info = await self.leader_appends.append(
                    tp, bytearray(records), required_acks, per_partition.get(tp, options)
                )
            except OSError as e:
                assert partition is not None
                error = self.log_manager.storage_error(
                    partition.log.dir.parent, tp, e, f"appending to {tp}"
                )
                results[tp] = ProduceResult(error.code, error_message=str(error))
                continue
            except InvalidRecordError as e:
                log.info("produce to %s refused: %s", tp, e)
                results[tp] = ProduceResult(
                    e.code,
                    error_message=e.args[0],  # Kafka's words, without the code's name
                    record_errors=e.record_errors if isinstance(e, RecordValidationError) else (),
                )
                continue
            except KafkaError as e:
                results[tp] = ProduceResult(e.code, error_message=str(e))
                continue
            results[tp] = ProduceResult(
                ErrorCode.none, info.first_offset, info.log_append_time_ms, info.log_start_offset
            )
            self._wake(tp)
            if required_acks == -1 and info.record_count:
                waiting[tp] = info.last_offset + 1
        if waiting:
            await self._wait_for_replicas(results, waiting, timeout_ms)
        return results

    async def _verified(
        self,
        entries: dict[TopicPartition, bytes],
        options: AppendOptions,
        operation: TransactionSupportedOperation,
        results: dict[TopicPartition, ProduceResult],
    ) -> dict[TopicPartition, AppendOptions]:
        """KIP-890 part 1: a transaction's first batch to a partition is appended only if its
        coordinator confirms the transaction has the partition (else a produce after an
        abort, or without AddPartitionsToTxn, would open a transaction no marker closes);
        part 2: for transactions v2 the coordinator adds it. Returns each checked
        partition's options with its guard; refusals go to `results`, as Kafka answers
        them (`producer_error`)."""
        transactional_id = options.transactional_id
        if transactional_id is None or self.verify_transaction is None:
            return {}
        checks: dict[TopicPartition, tuple[BatchView, VerificationGuard]] = {}
        for tp, records in entries.items():
            partition = self.partitions.get(tp)
            if partition is None or len(records) < BATCH_HEADER_SIZE:
                continue  # the append answers it
            first = BatchView(records)
            if not first.is_transactional:
                continue
            guard = partition.log.producer_state.start_verification(
                first.producer_id, first.producer_epoch, operation.adds
            )
            if guard is not None:
                checks[tp] = (first, guard)
        if not checks:
            return {}
        first = next(iter(checks.values()))[0]
        errors = await self.verify_transaction(
            transactional_id, first.producer_id, first.producer_epoch, set(checks), operation.adds
        )
        verified: dict[TopicPartition, AppendOptions] = {}
        for tp, (batch, check) in checks.items():
            error = errors.get(tp, ErrorCode.invalid_txn_state)
            if error == ErrorCode.none:
                verified[tp] = replace(options, verification_guard=check)
                continue
            partition = self.partitions.get(tp)
            if partition is not None:
                partition.log.producer_state.end_verification(batch.producer_id, check)
            code = producer_error(error, operation)
            log.info(
                "transactional produce of %r to %s refused: its coordinator answered %s",
                transactional_id,
                tp,
                error.name.upper(),
            )
            results[tp] = ProduceResult(code, error_message=f"{tp}: {error.name.upper()}")
        return verified

    async def write_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        marker: EndTxnMarker,
        partitions: list[TopicPartition],
        timeout_ms: int,
        transaction_version: int,
    ) -> dict[TopicPartition, ErrorCode]:
        """WriteTxnMarkers, one marker to each partition led here, acks=all; each partition's
        error. `transaction_version`: the client's, which says how the marker's epoch is
        checked. The marker listeners hear of each written one (the group coordinator makes
        the offsets a transaction committed visible)."""
        results: dict[TopicPartition, ProduceResult] = {}
        waiting: dict[TopicPartition, int] = {}
        for tp in partitions:
            if self.fenced:
                results[tp] = ProduceResult(ErrorCode.not_leader_or_follower)
                continue
            partition: Partition | None = None
            try:
                partition = self.partition_or_error(tp)
                info = partition.append_end_txn_marker(
                    producer_id, producer_epoch, marker, transaction_version
                )
            except OSError as e:
                assert partition is not None
                error = self.log_manager.storage_error(
                    partition.log.dir.parent, tp, e, f"writing a marker to {tp}"
                )
                results[tp] = ProduceResult(error.code, error_message=str(error))
                continue
            except KafkaError as e:
                log.info("marker of producer %d to %s refused: %s", producer_id, tp, e)
                results[tp] = ProduceResult(e.code)
                continue
            results[tp] = ProduceResult(ErrorCode.none, info.first_offset)
            self._wake(tp)
            waiting[tp] = info.last_offset + 1
        if waiting:
            await self._wait_for_replicas(results, waiting, timeout_ms)
        for tp, result in results.items():
            if result.error == ErrorCode.none:
                for listener in self.txn_marker_listeners:
                    listener(tp, producer_id, marker)
        return {tp: result.error for tp, result in results.items()}

    async def _wait_for_replicas(
        self,
        results: dict[TopicPartition, ProduceResult],
        waiting: dict[TopicPartition, int],
        timeout_ms: int,
    ) -> None:
        """Kafka's DelayedProduce: each partition answers NONE once the high watermark passes
        its records, NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below
        min.insync.replicas meanwhile, NOT_LEADER_OR_FOLLOWER if leadership moved, or
        REQUEST_TIMED_OUT."""
        outcome: dict[TopicPartition, ErrorCode] = {}

        def settled() -> bool:
            for tp, offset in waiting.items():
                if tp in outcome:
                    continue
                partition = self.partitions.get(tp)
                code = (
                    partition.check_enough_replicas(offset)
                    if partition is not None and not self.fenced
                    else ErrorCode.not_leader_or_follower
                )
                if code is not None:
                    outcome[tp] = code
            return len(outcome) == len(waiting)

        await self.produce_purgatory.wait_until(waiting, timeout_ms / 1000, settled)
        for tp in waiting:
            code = outcome.get(tp, ErrorCode.request_timed_out)
            if code != ErrorCode.none:
                results[tp] = replace(results[tp], error=code, error_message=None)

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """DeleteRecords: move the log start offset (-1: to the high watermark); returns it."""
        partition = self.partition_or_error(tp)
        partition.check_leader(-1)
        log_ = partition.log
        target = log_.high_watermark if offset == -1 else offset
        if target < 0:
            raise KafkaError(
                ErrorCode.offset_out_of_range, f"{tp}: cannot delete records below {offset}"
            )
        log_.maybe_increment_log_start_offset(
            target, LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION
        )
        log_.delete_old_segments()
        return log_.log_start_offset

    # Fetch ---------------------------------------------------------------------------

    async def fetch_messages(
        self, params: FetchParams, requests: list[FetchRequestPartition]
    ) -> list[FetchResultPartition]:
        return await self.reader.fetch_messages(params, requests)

    def _on_follower_fetch(self, partition: Partition, fetch: FollowerFetch) -> None:
        """A follower fetched: its state, perhaps the high watermark, perhaps the ISR."""
        if partition.update_follower_fetch_state(fetch, now_ms()):
            self._wake(partition.topic_partition)
        expanded = partition.isr_expansion(
            fetch.replica_id, self._is_isr_eligible(fetch.replica_id, fetch.broker_epoch)
        )
        if expanded is not None:
            self.alter_partition.submit(partition, expanded)

    # Offsets -------------------------------------------------------------------------

    async def fetch_offset_for_timestamp(
        self,
        tp: TopicPartition,
        timestamp_ms: int,
        current_leader_epoch: int,
        timeout_s: float | None = None,
        *,
        replica_id: int = -1,
        read_committed: bool = False,
    ) -> OffsetAndEpoch | None:
        """ListOffsets; a timestamp in the remote tier is looked up there, off the request loop.

        A remote lookup outliving `timeout_s` (or the remote call timeout) is REQUEST_TIMED_OUT.
        A follower asking (its broker id as ReplicaId) sees offsets up to the log end, as
        Kafka answers replicas; consumers up to the high watermark (read_committed ones the
        last stable offset); and a follower of the partition answers the debugging consumer
        (ReplicaId -2).
        """
        partition = self.partition_or_error(tp)
        lg = partition.log
        if timestamp_ms >= 0 and self.remote is not None and lg.config.remote_storage_enable:
            partition.check_readable(current_leader_epoch, replica_id == DEBUGGING_CONSUMER)
            tip = TopicIdPartition(partition.topic_id, tp)
            try:
                found = await self.remote.find_offset_by_timestamp(
                    tip, lg, timestamp_ms, lg.log_start_offset, timeout_s
                )
            except TimeoutError as e:
                raise KafkaError(ErrorCode.request_timed_out, f"{tp}: remote lookup") from e
            except RemoteStorageError as e:
                raise KafkaError(ErrorCode.kafka_storage_error, f"{tp}: remote tier: {e}") from e
            if found is not None and found[0] < lg.local_log_start_offset:
                offset, timestamp = found
                return OffsetAndEpoch(
                    offset, timestamp, lg.leader_epoch_cache.epoch_for_offset(offset)
                )
        return partition.fetch_offset_for_timestamp(
            timestamp_ms, current_leader_epoch, replica_id, read_committed
        )

    def last_offset_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[int, int]:
        return self.partition_or_error(tp).last_offset_for_leader_epoch(
            current_leader_epoch, leader_epoch
        )

    # Shutdown ------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop following the metadata, fetching and writing ISR changes; answer waiters."""
        if self._applier is not None:
            self._applier.cancel()
            await asyncio.gather(self._applier, return_exceptions=True)
            self._applier = None
        await self.fetchers.close()
        await self.alter_partition.close()
        for tp in list(self.partitions):
            self._wake(tp)
