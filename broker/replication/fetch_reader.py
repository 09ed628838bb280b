"""`FetchReader`: a Fetch request's reads across the partitions hosted here.

For a follower of a partition led here: Kafka's fetch-time diverging-epoch check, a
read up to the log end, and the follower's fetch state (which may widen the ISR and
move the high watermark). For a consumer (KIP-392):

- of a partition led here, the leader's selector may prefer another replica (fetches
  v11+ with the client's rack): the answer is that replica's id and no records, at once;
- of a partition followed here (fetches v11+ only; older ones get NOT_LEADER_OR_FOLLOWER),
  committed data only: an offset up to this replica's log end waits for the high
  watermark; one beyond it but within the leader's last high watermark waits for the
  records and then, if still missing, gets OFFSET_NOT_AVAILABLE (not OUT_OF_RANGE, on
  which some clients reset their offsets); beyond that, or below the log start,
  OFFSET_OUT_OF_RANGE with this replica's log start and high watermark.

Offsets below the local log but within the log are read from the remote tier, on
leaders and followers alike, concurrently, each within the byte budget left when its
turn came. A fetch short of `min_bytes` waits in the fetch purgatory; one of a
follower also completes when the high watermark moved past what it was last told, and
when the follower became a replica of another partition led here (`wake_follower`), so
that it asks for that partition now rather than after `replica.fetch.wait.max.ms`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.network.request_context import current_request
from tierbroker.broker.replication.partition import FollowerFetch, OffsetNotAvailableYet, Partition
from tierbroker.broker.replication.purgatory import Purgatory
from tierbroker.broker.replication.replica_selector import (
    ClientMetadata,
    Node,
    PartitionView,
    ReplicaSelector,
    ReplicaView,
)
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.log import Log, OffsetMovedToTieredStorage, now_ms
from tierbroker.storage.log_offset_metadata import LogOffsetMetadata
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.segment import FileSlice
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.storage.transaction_index import AbortedTxn

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FetchRequestPartition:
    topic_partition: TopicPartition
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1  # a follower's


@dataclass(frozen=True, slots=True)
class FetchResultPartition:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FileSlice | memoryview | None = None  # a view: read from the remote tier
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end offset) for a follower
    preferred_read_replica: int = -1
    not_available: bool = False  # past this follower's end: OFFSET_NOT_AVAILABLE if it stays
    last_stable_offset: int = -1  # -1: the high watermark
    aborted_txns: list[AbortedTxn] | None = None  # read_committed: those the records touch

    @property
    def size(self) -> int:
        if self.records is None:
            return 0
        return self.records.length if isinstance(self.records, FileSlice) else len(self.records)


@dataclass(frozen=True, slots=True)
class FetchParams:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    replica_id: int = -1  # a follower's broker id; -1 for consumers
    replica_epoch: int = -1
    client: ClientMetadata | None = None  # a consumer's, from Fetch v11 on
    read_committed: bool = False  # isolation level 1, from Fetch v4 on

    @property
    def is_from_follower(self) -> bool:
        return self.replica_id >= 0


_PENDING_HORIZON_S = 60.0  # beyond any fetch's max wait


@dataclass(frozen=True, slots=True)
class _FollowerWake:
    """The purgatory key of a follower's parked fetches."""

    broker_id: int


@dataclass(frozen=True, slots=True)
class _RemoteRead:
    index: int  # position in the fetch's results
    partition: Partition
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _WaitingAt:
    """Where a delayed fetch waits on one partition: the end it read up to (the high
    watermark, or a follower's log end) when that was its fetch offset, as Kafka's
    DelayedFetch keeps the fetch offset's LogOffsetMetadata. Valid while the partition,
    its log, its leader and its leader epoch are those of the first read."""

    partition: Partition
    log: Log
    leader_id: int
    leader_epoch: int
    max_bytes: int
    start: LogOffsetMetadata

    def bytes_or_newer_segment(self, from_follower: bool) -> int | None:
        """The bytes appended past `start`, up to `max_bytes`; None when the end is on
        another segment or below `start` (the fetch completes and reads, as in Kafka)."""
        end = (
            self.log.log_end_offset_metadata if from_follower else self.log.high_watermark_metadata
        )
        if (
            end.segment_base_offset != self.start.segment_base_offset
            or end.message_offset < self.start.message_offset
        ):
            return None
        return min(
            self.max_bytes,
            end.relative_position_in_segment - self.start.relative_position_in_segment,
        )


class FetchReader:
    def __init__(
        self,
        partition_or_error: Callable[[TopicPartition], Partition],
        partitions: dict[TopicPartition, Partition],
        cache: MetadataCache,
        purgatory: Purgatory,
        on_follower_fetch: Callable[[Partition, FollowerFetch], None],
    ) -> None:
        self.partition_or_error = partition_or_error
        self.partitions = partitions
        self.cache = cache
        self.purgatory = purgatory
        self.on_follower_fetch = on_follower_fetch  # its fetch state, the ISR, the HW
        self.selector: ReplicaSelector | None = None
        self.remote: RemoteLogManager | None = None
        self.propagate_high_watermark = False
        # Per follower: partitions it became a replica of here and has not asked for yet,
        # with the loop time it became one.
        self._new_to_follower: dict[int, dict[TopicPartition, float]] = {}

    def wake_follower(self, broker_id: int, tp: TopicPartition) -> None:
        """The follower became a replica of `tp`, led here: answer its parked fetches now,
        and its next ones at once until one asks for `tp`, so it starts fetching `tp` at its
        next fetch rather than after `replica.fetch.wait.max.ms`."""
        now = asyncio.get_running_loop().time()
        pending = self._new_to_follower.setdefault(broker_id, {})
        for old in [p for p, since in pending.items() if since < now - _PENDING_HORIZON_S]:
            del pending[old]  # a follower that stopped fetching keeps no growing list
        pending[tp] = now
        self.purgatory.notify(_FollowerWake(broker_id))

    def _awaits_new_partitions(
        self, params: FetchParams, requests: list[FetchRequestPartition]
    ) -> bool:
        """The follower has a partition here it has not asked for yet (for at most its
        fetch's max wait: one that cannot fetch it is not answered at once for ever)."""
        pending = self._new_to_follower.get(params.replica_id)
        if not pending:
            return False
        oldest = asyncio.get_running_loop().time() - params.max_wait_ms / 1000
        for r in requests:
            pending.pop(r.topic_partition, None)
        for tp in [tp for tp, since in pending.items() if since < oldest]:
            del pending[tp]
        if not pending:
            del self._new_to_follower[params.replica_id]
        return bool(pending)

    async def fetch_messages(
        self, params: FetchParams, requests: list[FetchRequestPartition]
    ) -> list[FetchResultPartition]:
        """Read every requested partition; wait up to max_wait_ms for min_bytes (a delayed
        fetch). A waiting fetch that finds, when woken, its offset gone from the local log
        (local retention deleted it meanwhile) completes and reads the remote tier, as
        Kafka's DelayedFetch completes for an offset on an older segment."""
        results, remote = self._read(params, requests)
        if (
            params.max_wait_ms > 0
            and requests
            and not self._satisfied(params, requests, results, remote)
        ):
            keys: list[Hashable] = [r.topic_partition for r in requests]
            if params.is_from_follower:
                keys.append(_FollowerWake(params.replica_id))
            waiting_at = self._waiting_at(params, requests, results)
            await self.purgatory.wait_until(
                keys,
                params.max_wait_ms / 1000,
                lambda: self._satisfied_on_wake(params, requests, waiting_at),
            )
            results, remote = self._read(params, requests)
        if remote:
            await self._read_remote(results, remote, params.read_committed)
        if params.is_from_follower:
            self._remember_sent_high_watermarks(params.replica_id, requests, results)
        return [
            replace(r, error=ErrorCode.offset_not_available, not_available=False)
            if r.not_available
            else r
            for r in results
        ]

    def _satisfied(
        self,
        params: FetchParams,
        requests: list[FetchRequestPartition],
        results: list[FetchResultPartition],
        remote: list[_RemoteRead],
    ) -> bool:
        """A delayed fetch completes on an error, a remote read, a diverging epoch or a
        preferred replica, min_bytes of data, or (a follower's) a high watermark it has
        not been told yet or a partition here it has not asked for yet."""
        if remote or any(
            r.error != ErrorCode.none
            or r.diverging_epoch is not None
            or r.preferred_read_replica >= 0
            for r in results
        ):
            return True
        if params.is_from_follower and (
            self._high_watermark_news(params.replica_id, requests)
            or self._awaits_new_partitions(params, requests)
        ):
            return True
        return sum(r.size for r in results) >= params.min_bytes

    def _waiting_at(
        self,
        params: FetchParams,
        requests: list[FetchRequestPartition],
        results: list[FetchResultPartition],
    ) -> list[_WaitingAt] | None:
        """Where the fetch waits on each partition, if it read nothing from each because
        its fetch offset was the end; None otherwise, and for read_committed (each wake
        then reads again)."""
        if params.read_committed:
            return None
        waiting_at = []
        for request, result in zip(requests, results, strict=True):
            partition = self.partitions.get(request.topic_partition)
            if partition is None or result.records is not None or result.not_available:
                return None
            lg = partition.log
            end = (
                lg.log_end_offset_metadata
                if params.is_from_follower
                else lg.high_watermark_metadata
            )
            if request.fetch_offset != end.message_offset:
                return None
            waiting_at.append(
                _WaitingAt(
                    partition=partition,
                    log=lg,
                    leader_id=partition.leader_id,
                    leader_epoch=partition.leader_epoch,
                    max_bytes=request.max_bytes,
                    start=end,
                )
            )
        return waiting_at

    def _satisfied_on_wake(
        self,
        params: FetchParams,
        requests: list[FetchRequestPartition],
        waiting_at: list[_WaitingAt] | None,
    ) -> bool:
        """A woken delayed fetch: from the positions it waits at when every partition
        is as it was (no read, no batch header), else by reading again."""
        if waiting_at is None or any(
            self.partitions.get(w.partition.topic_partition) is not w.partition
            or w.partition.log is not w.log
            or w.partition.leader_id != w.leader_id
            or w.partition.leader_epoch != w.leader_epoch
            for w in waiting_at
        ):
            return self._satisfied(params, requests, *self._read(params, requests, update=False))
        if params.is_from_follower and (
            self._high_watermark_news(params.replica_id, requests)
            or self._awaits_new_partitions(params, requests)
        ):
            return True
        accumulated = 0
        for w in waiting_at:
            available = w.bytes_or_newer_segment(params.is_from_follower)
            if available is None:
                return True
            accumulated += available
        return accumulated >= params.min_bytes

    def _high_watermark_news(self, replica_id: int, requests: list[FetchRequestPartition]) -> bool:
        """The follower was last told a lower high watermark than a partition now has
        (KIP-392: a follower serving consumers must learn it promptly)."""
        if not self.propagate_high_watermark:
            return False
        for request in requests:
            partition = self.partitions.get(request.topic_partition)
            if partition is None:
                continue
            replica = partition.remote_replicas.get(replica_id)
            if replica is not None and replica.last_sent_high_watermark < partition.high_watermark:
                return True
        return False

    def _remember_sent_high_watermarks(
        self,
        replica_id: int,
        requests: list[FetchRequestPartition],
        results: list[FetchResultPartition],
    ) -> None:
        for request, result in zip(requests, results, strict=True):
            partition = self.partitions.get(request.topic_partition)
            replica = partition.remote_replicas.get(replica_id) if partition else None
            if replica is not None:
                replica.last_sent_high_watermark = result.high_watermark

    def _read(
        self, params: FetchParams, requests: list[FetchRequestPartition], update: bool = True
    ) -> tuple[list[FetchResultPartition], list[_RemoteRead]]:
        bytes_left = params.max_bytes
        min_one_batch = True  # KIP-74: the first partition with data returns a batch even if big
        results: list[FetchResultPartition] = []
        remote: list[_RemoteRead] = []
        for request in requests:
            budget = min(bytes_left, request.max_bytes)
            result = self._read_partition(params, request, budget, min_one_batch, update)
            if isinstance(result, _RemoteRead):
                remote.append(replace(result, index=len(results)))
                results.append(FetchResultPartition(ErrorCode.none))
                bytes_left -= budget  # reserved: the remote read may use all of it
                min_one_batch = False
                continue
            if result.records is not None:
                bytes_left -= result.size
                min_one_batch = False
            results.append(result)
        return results, remote

    def _read_partition(
        self,
        params: FetchParams,
        request: FetchRequestPartition,
        max_bytes: int,
        min_one_batch: bool,
        update: bool,
    ) -> FetchResultPartition | _RemoteRead:
        try:
            partition = self.partition_or_error(request.topic_partition)
            if params.is_from_follower:
                return self._read_for_follower(params, partition, request, max_bytes, update)
            if partition.is_leader and params.client is not None and self.selector is not None:
                preferred = self._preferred_replica(partition, request.fetch_offset, params.client)
                if preferred >= 0:
                    return FetchResultPartition(
                        ErrorCode.none,
                        partition.high_watermark,
                        partition.log.log_start_offset,
                        preferred_read_replica=preferred,
                    )
            if max_bytes <= 0 and not min_one_batch:
                partition.check_readable(request.current_leader_epoch, params.client is not None)
                return FetchResultPartition(
                    ErrorCode.none, partition.high_watermark, partition.log.log_start_offset
                )
            data = partition.read(
                request.fetch_offset,
                max_bytes,
                min_one_batch,
                request.current_leader_epoch,
                from_follower_allowed=params.client is not None,
                read_committed=params.read_committed,
            )
            return self._result(partition, data.records, data.aborted_txns)
        except OffsetNotAvailableYet:
            partition = self.partitions[request.topic_partition]
            return FetchResultPartition(
                ErrorCode.none,
                partition.high_watermark,
                partition.log.log_start_offset,
                not_available=True,
            )
        except OffsetMovedToTieredStorage:
            if self.remote is None or params.is_from_follower:
                code = (
                    ErrorCode.offset_moved_to_tiered_storage
                    if params.is_from_follower
                    else ErrorCode.offset_out_of_range
                )
                return self._error(request, code)
            budget = max_bytes if max_bytes > 0 else 1  # min one batch: the reader returns one
            return _RemoteRead(
                -1, self.partitions[request.topic_partition], request.fetch_offset, budget
            )
        except KafkaError as e:
            return self._error(request, e.code)

    def _preferred_replica(
        self, partition: Partition, fetch_offset: int, client: ClientMetadata
    ) -> int:
        """The replica the selector prefers for this consumer, if not the leader (-1)."""
        assert self.selector is not None
        now = now_ms()
        views: list[ReplicaView] = []
        leader_view: ReplicaView | None = None
        for broker_id in partition.replicas:
            registration = self.cache.brokers.get(broker_id)
            if registration is None:
                continue
            # A replica the client cannot reach on its listener is no choice for it.
            endpoint = registration.endpoint(current_request().listener_name)
            if endpoint is None:
                continue
            node = Node(broker_id, endpoint.host, endpoint.port, registration.rack)
            if broker_id == partition.local_broker_id:
                leader_view = ReplicaView(node, partition.log.log_end_offset, 0)
                views.append(leader_view)
                continue
            replica = partition.remote_replicas.get(broker_id)
            if (
                replica is None
                or broker_id not in partition.isr
                or not replica.log_start_offset <= fetch_offset <= replica.log_end_offset
            ):
                continue
            views.append(
                ReplicaView(node, replica.log_end_offset, now - replica.last_caught_up_time_ms)
            )
        if leader_view is None:
            return -1
        chosen = self.selector.select(
            partition.topic_partition, client, PartitionView(views, leader_view)
        )
        if chosen is None or chosen.endpoint.id == partition.local_broker_id:
            return -1
        return chosen.endpoint.id

    def _read_for_follower(
        self,
        params: FetchParams,
        partition: Partition,
        request: FetchRequestPartition,
        max_bytes: int,
        update: bool,
    ) -> FetchResultPartition:
        fetch = FollowerFetch(
            params.replica_id,
            params.replica_epoch,
            request.fetch_offset,
            request.last_fetched_epoch,
            request.log_start_offset,
            request.current_leader_epoch,
        )
        partition.check_leader(request.current_leader_epoch)
        diverging = partition.diverging_epoch(fetch)
        if diverging is not None:
            return FetchResultPartition(
                ErrorCode.none,
                partition.high_watermark,
                partition.log.log_start_offset,
                diverging_epoch=(diverging.epoch, diverging.end_offset),
            )
        data = partition.read_for_follower(fetch, max(max_bytes, 1))
        if update:
            self.on_follower_fetch(partition, fetch)
        return self._result(partition, data.records)

    def _result(
        self,
        partition: Partition,
        records: FileSlice | None,
        aborted_txns: list[AbortedTxn] | None = None,
    ) -> FetchResultPartition:
        return FetchResultPartition(
            ErrorCode.none,
            partition.high_watermark,
            partition.log.log_start_offset,
            # Too many log files held open: a response must not hold one more.
            memoryview(records.read())
            if records is not None and partition.log.file_cache.under_pressure
            else records,
            last_stable_offset=partition.log.last_stable_offset,
            aborted_txns=aborted_txns,
        )

    def _error(self, request: FetchRequestPartition, code: ErrorCode) -> FetchResultPartition:
        hosted = self.partitions.get(request.topic_partition)
        if hosted is None:
            return FetchResultPartition(code)
        return FetchResultPartition(code, hosted.high_watermark, hosted.log.log_start_offset)

    async def _read_remote(
        self, results: list[FetchResultPartition], reads: list[_RemoteRead], read_committed: bool
    ) -> None:
        outcomes = await asyncio.gather(
            *(self._remote_read(r, read_committed) for r in reads), return_exceptions=True
        )
        for read, outcome in zip(reads, outcomes, strict=True):
            lg = read.partition.log
            if isinstance(outcome, tuple):
                records, aborted = outcome
                results[read.index] = FetchResultPartition(
                    ErrorCode.none,
                    lg.high_watermark,
                    lg.log_start_offset,
                    records,
                    last_stable_offset=lg.last_stable_offset,
                    aborted_txns=aborted,
                )
                continue
            code = _remote_error_code(outcome)
            log.info(
                "remote read of %s at offset %d: %s",
                read.partition.topic_partition,
                read.offset,
                code.name.upper() if code != ErrorCode.kafka_storage_error else outcome,
            )
            results[read.index] = FetchResultPartition(code, lg.high_watermark, lg.log_start_offset)

    async def _remote_read(
        self, read: _RemoteRead, read_committed: bool
    ) -> tuple[memoryview, list[AbortedTxn] | None]:
        """The remote tier's batches, with the aborted transactions they touch if read
        committed (all remote offsets are below the last stable offset)."""
        assert self.remote is not None
        tip = TopicIdPartition(read.partition.topic_id, read.partition.topic_partition)
        lg = read.partition.log
        records = await self.remote.read(tip, lg, read.offset, read.max_bytes)
        if not read_committed:
            return records, None
        return records, await self.remote.aborted_txns(tip, lg, read.offset, records)


def _remote_error_code(error: BaseException) -> ErrorCode:
    if isinstance(error, KafkaError):
        return error.code
    if isinstance(error, TimeoutError):
        return ErrorCode.request_timed_out  # the read goes on; the client's retry finds it
    return ErrorCode.kafka_storage_error
