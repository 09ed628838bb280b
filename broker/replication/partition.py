"""`Partition`: one partition's replica on this broker, as leader or as follower.

As leader it stamps appends with its leader epoch, tracks each follower (`ReplicaState`)
from the follower's fetches, moves the high watermark to the lowest log end offset of
its maximal ISR and of the caught-up followers eligible to join it (not while the ISR is
below `min.insync.replicas`, as Kafka since KAFKA-15583), and asks for ISR changes: a
caught-up follower in, a lagging one out.
The ISR is the committed one (as last written to the partition state); while a change
is in flight, `pending_isr` holds the one asked for, and the maximal ISR (committed and
any replica being added) is what the high watermark and acks=all count, as in Kafka's
KIP-497. As follower it appends what its leader sent, keeping offsets and epochs.

Leadership changes come from the partition state the controller wrote (`make_leader`,
`make_follower`); a state older than the one held (leader epoch, then partition epoch)
is ignored. Not shared between tasks: the event loop owns it, and appends are
synchronous, so they are serialised.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tierbroker.broker.metadata.zk_data import NO_LEADER, PartitionState
from tierbroker.broker.replication.replica import ReplicaState
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BatchView
from tierbroker.protocol.records.control import EndTxnMarker
from tierbroker.storage.log import (
    CLIENT_APPEND,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AppendOptions,
    FetchDataInfo,
    Log,
    LogAppendInfo,
    LogStartOffsetIncrementReason,
    now_ms,
)
from tierbroker.storage.topic_partition import TopicPartition

DEBUGGING_CONSUMER = -2  # ListOffsets' ReplicaId that any replica may answer


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    offset: int
    timestamp: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class FollowerFetch:
    """What a follower's fetch asked for."""

    replica_id: int
    broker_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    current_leader_epoch: int


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    epoch: int
    end_offset: int


class OffsetNotAvailableYet(Exception):
    """A follower's consumer asked for an offset past this replica's log end that the
    leader's high watermark already covers: it may arrive with the next replica fetch."""


class Partition:
    def __init__(
        self,
        log: Log,
        local_broker_id: int,
        replica_lag_time_max_ms: int = 30_000,
        is_isr_eligible: Callable[[int], bool] = lambda _broker_id: True,
    ):
        self.log = log
        self.local_broker_id = local_broker_id
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        # Whether a broker may join an ISR: registered and not shutting down (KIP-841).
        self.is_isr_eligible = is_isr_eligible
        self.leader_id = NO_LEADER
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.controller_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: frozenset[int] = frozenset()
        self.pending_isr: frozenset[int] | None = None
        self.remote_replicas: dict[int, ReplicaState] = {}
        self.leader_epoch_start_offset = -1
        self.leader_high_watermark = -1  # as a follower: the last one its leader sent

    @property
    def topic_partition(self) -> TopicPartition:
        return self.log.topic_partition

    @property
    def topic_id(self) -> uuid.UUID:
        return self.log.topic_id

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | self.pending_isr if self.pending_isr is not None else self.isr

    @property
    def min_insync_replicas(self) -> int:
        """`min.insync.replicas`, capped at the replication factor (Kafka's effective min ISR)."""
        return min(self.log.config.min_insync_replicas, max(1, len(self.replicas)))

    @property
    def is_under_min_isr(self) -> bool:
        return len(self.isr) < self.min_insync_replicas

    @property
    def is_under_replicated(self) -> bool:
        return self.is_leader and len(self.isr) < len(self.replicas)

    # Leadership ----------------------------------------------------------------------

    def is_stale(self, state: PartitionState) -> bool:
        """`state` is older than what this replica holds."""
        return (state.leader_epoch, state.partition_epoch) < (
            self.leader_epoch,
            self.partition_epoch,
        )

    def make_leader(self, state: PartitionState, replicas: tuple[int, ...]) -> bool:
        """Lead under `state`; True if this starts a new leadership (a new leader epoch).

        As Kafka's makeLeader: the new epoch starts at the log end offset before any
        append, and what was known of followers is reset."""
        new_leadership = not self.is_leader or state.leader_epoch != self.leader_epoch
        self._take(state, replicas)
        now = now_ms()
        self.remote_replicas = {
            b: self.remote_replicas.get(b) or ReplicaState(b)
            for b in replicas
            if b != self.local_broker_id
        }
        if new_leadership:
            self.log.leader_epoch_cache.assign(state.leader_epoch, self.log.log_end_offset)
            self.leader_epoch_start_offset = self.log.log_end_offset
            for replica in self.remote_replicas.values():
                replica.reset(now, replica.broker_id in self.isr)
        self.maybe_increment_leader_hw(now)
        return new_leadership

    def make_follower(self, state: PartitionState, replicas: tuple[int, ...]) -> bool:
        """Follow under `state`; True if the leader or its epoch changed."""
        changed = self.leader_id != state.leader or self.leader_epoch != state.leader_epoch
        self._take(state, replicas)
        self.remote_replicas = {}
        self.leader_epoch_start_offset = -1
        return changed

    def _take(self, state: PartitionState, replicas: tuple[int, ...]) -> None:
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.controller_epoch = state.controller_epoch
        self.replicas = replicas
        self.isr = frozenset(state.isr)
        self.pending_isr = None

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """Fence a client whose view of the leader epoch differs (-1: no check), as Kafka does."""
        if current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch:
            return
        fenced = current_leader_epoch < self.leader_epoch
        raise KafkaError(
            ErrorCode.fenced_leader_epoch if fenced else ErrorCode.unknown_leader_epoch,
            f"{self.topic_partition}: leader epoch {current_leader_epoch} given, "
            f"current {self.leader_epoch}",
        )

    def check_readable(self, current_leader_epoch: int, follower_allowed: bool) -> None:
        """A consumer may read here: this replica leads, or follows and `follower_allowed`
        (a fetch of v11 or later, which KIP-392 lets read a follower)."""
        if follower_allowed and self.leader_id != NO_LEADER:
            self.check_leader_epoch(current_leader_epoch)
            return
        self.check_leader(current_leader_epoch)

    def check_leader(self, current_leader_epoch: int) -> None:
        self.check_leader_epoch(current_leader_epoch)
        if not self.is_leader:
            raise KafkaError(
                ErrorCode.not_leader_or_follower,
                f"{self.topic_partition}: broker {self.local_broker_id} is not the leader "
                f"(leader {self.leader_id}, epoch {self.leader_epoch})",
            )

    # Leader: appends and the high watermark ------------------------------------------

    def append_records_to_leader(
        self,
        records: bytearray,
        required_acks: int,
        validated: tuple[bytearray, list[BatchView]] | None = None,
        options: AppendOptions = CLIENT_APPEND,
    ) -> LogAppendInfo:
        """Append as leader (`validated`, `options`: as `Log.append_as_leader`);
        NOT_ENOUGH_REPLICAS before writing anything if acks=all and the ISR is smaller than
        `min.insync.replicas`."""
        self._check_min_isr(required_acks)
        info = self.log.append_as_leader(records, self.leader_epoch, validated, options)
        self.maybe_increment_leader_hw(now_ms())
        return info

    def append_end_txn_marker(
        self, producer_id: int, producer_epoch: int, marker: EndTxnMarker, transaction_version: int
    ) -> LogAppendInfo:
        """Write a transaction coordinator's marker as leader, as acks=all."""
        self._check_min_isr(-1)
        info = self.log.append_end_txn_marker(
            producer_id, producer_epoch, marker, self.leader_epoch, transaction_version
        )
        self.maybe_increment_leader_hw(now_ms())
        return info

    def _check_min_isr(self, required_acks: int) -> None:
        self.check_leader(-1)
        if required_acks == -1 and self.is_under_min_isr:
            raise KafkaError(
                ErrorCode.not_enough_replicas,
                f"{self.topic_partition}: ISR {sorted(self.isr)} is smaller than "
                f"min.insync.replicas {self.min_insync_replicas}",
            )

    def maybe_increment_leader_hw(self, now: int) -> bool:
        """Move the high watermark up to the lowest log end offset among the maximal ISR and
        the caught-up followers that may join it; True if it moved.

        As Kafka's shouldWaitForReplicaToJoinIsr: a caught-up follower outside the ISR is
        waited for only while it is eligible, so a broker gone or in a controlled shutdown,
        which fetched up to the log end just before, does not hold the high watermark (and
        acks=all) back for `replica.lag.time.max.ms`."""
        if not self.is_leader or self.is_under_min_isr:
            return False
        end = self.log.log_end_offset
        high_watermark = end
        maximal = self.maximal_isr
        for replica in self.remote_replicas.values():
            counts = replica.broker_id in maximal or (
                replica.is_caught_up(end, now, self.replica_lag_time_max_ms)
                and self.is_isr_eligible(replica.broker_id)
            )
            if counts and replica.log_end_offset < high_watermark:
                high_watermark = replica.log_end_offset
        if high_watermark <= self.log.high_watermark:
            return False
        self.log.update_high_watermark(high_watermark)
        return True

    def check_enough_replicas(self, required_offset: int) -> ErrorCode | None:
        """The answer of an acks=all produce waiting for `required_offset`, or None to wait."""
        if not self.is_leader:
            return ErrorCode.not_leader_or_follower
        if self.log.high_watermark < required_offset:
            return None
        if len(self.maximal_isr) < self.min_insync_replicas:
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    # Leader: followers' fetches and the ISR ------------------------------------------

    def diverging_epoch(self, fetch: FollowerFetch) -> DivergingEpoch | None:
        """Where the follower's log left the leader's, if it did (Kafka's fetch-time check)."""
        if fetch.last_fetched_epoch < 0:
            return None
        epoch, end = self.log.end_offset_for_epoch(fetch.last_fetched_epoch)
        if epoch < 0 or end < 0:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"{self.topic_partition}: no end offset for epoch {fetch.last_fetched_epoch}",
            )
        if end < fetch.fetch_offset or epoch < fetch.last_fetched_epoch:
            return DivergingEpoch(epoch, end)
        return None

    def read_for_follower(self, fetch: FollowerFetch, max_bytes: int) -> FetchDataInfo:
        """Batches up to the log end offset for a follower (KIP-74: at least one)."""
        self.check_leader(fetch.current_leader_epoch)
        if fetch.replica_id not in self.remote_replicas:
            raise KafkaError(
                ErrorCode.not_leader_or_follower,
                f"{self.topic_partition}: broker {fetch.replica_id} is not a replica",
            )
        return self.log.read(fetch.fetch_offset, max_bytes, self.log.log_end_offset, True)

    def update_follower_fetch_state(self, fetch: FollowerFetch, now: int) -> bool:
        """Record a follower's fetch; True if the high watermark moved."""
        replica = self.remote_replicas.get(fetch.replica_id)
        if replica is None:
            return False
        replica.update_fetch_state(
            fetch.fetch_offset,
            fetch.log_start_offset,
            now,
            self.log.log_end_offset,
            fetch.broker_epoch,
        )
        return self.maybe_increment_leader_hw(now)

    def isr_expansion(self, replica_id: int, is_eligible: bool) -> frozenset[int] | None:
        """The ISR with `replica_id` added, if it has caught up (its log end offset is at
        least the high watermark and the start of this leader epoch) and no change is in
        flight; else None."""
        replica = self.remote_replicas.get(replica_id)
        if (
            replica is None
            or not is_eligible
            or replica_id in self.isr
            or self.pending_isr is not None
            or replica.log_end_offset < self.log.high_watermark
            or replica.log_end_offset < self.leader_epoch_start_offset
        ):
            return None
        return self.isr | {replica_id}

    def isr_shrink(self, now: int) -> frozenset[int] | None:
        """The ISR without followers that stopped catching up, if any and no change is in
        flight; else None."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        end = self.log.log_end_offset
        lagging = {
            b
            for b in self.isr
            if b != self.local_broker_id
            and (
                (replica := self.remote_replicas.get(b)) is None
                or not replica.is_caught_up(end, now, self.replica_lag_time_max_ms)
            )
        }
        return self.isr - lagging if lagging else None

    # Follower ------------------------------------------------------------------------

    def append_records_to_follower(
        self, records: bytes | memoryview, leader_high_watermark: int, leader_log_start: int
    ) -> LogAppendInfo | None:
        """Append what the leader sent (if anything), then follow its high watermark and
        log start offset, each capped at this log's end."""
        info = self.log.append_as_follower(records) if records else None
        self.leader_high_watermark = leader_high_watermark
        self.log.update_high_watermark(min(leader_high_watermark, self.log.log_end_offset))
        if leader_log_start > self.log.log_start_offset:
            self.log.maybe_increment_log_start_offset(
                min(leader_log_start, self.log.high_watermark),
                LogStartOffsetIncrementReason.LEADER_OFFSET_INCREMENTED,
            )
        return info

    # Consumers -----------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        min_one_batch: bool,
        current_leader_epoch: int,
        from_follower_allowed: bool = False,
        read_committed: bool = False,
    ) -> FetchDataInfo:
        """A consumer's read, up to the high watermark, or the last stable offset with the
        aborted transactions it touches (`read_committed`). On a follower (KIP-392): an
        offset past the log end that the leader's high watermark covers raises
        OffsetNotAvailableYet, one past both OFFSET_OUT_OF_RANGE."""
        self.check_readable(current_leader_epoch, from_follower_allowed)
        lg = self.log
        if not self.is_leader and lg.log_end_offset < offset <= max(
            self.leader_high_watermark, lg.log_end_offset
        ):
            raise OffsetNotAvailableYet(offset)
        if read_committed:
            return lg.read(offset, max_bytes, lg.last_stable_offset, min_one_batch, True)
        return lg.read(offset, max_bytes, lg.high_watermark, min_one_batch)

    def fetch_offset_for_timestamp(
        self,
        timestamp_ms: int,
        current_leader_epoch: int,
        replica_id: int = -1,
        read_committed: bool = False,
    ) -> OffsetAndEpoch | None:
        """ListOffsets, for consumers up to the high watermark (read_committed: the last
        stable offset). A follower answers only the debugging consumer (ReplicaId -2), as
        Kafka does: earliest is its local log start, latest its high watermark."""
        from_follower = replica_id >= 0
        if replica_id == DEBUGGING_CONSUMER and not self.is_leader:
            self.check_leader_epoch(current_leader_epoch)
            if timestamp_ms == EARLIEST_TIMESTAMP:
                offset = self.log.local_log_start_offset
                return OffsetAndEpoch(
                    offset, -1, self.log.leader_epoch_cache.epoch_for_offset(offset)
                )
            if timestamp_ms == LATEST_TIMESTAMP:
                offset = self.log.high_watermark
                return OffsetAndEpoch(
                    offset, -1, self.log.leader_epoch_cache.epoch_for_offset(offset)
                )
        else:
            self.check_leader(current_leader_epoch)
        found = self.log.fetch_offset_by_timestamp(timestamp_ms)
        if from_follower:
            return OffsetAndEpoch(*found) if found is not None else None
        hw = self.log.high_watermark
        fetchable = self.log.last_stable_offset if read_committed else hw
        # A timestamp lookup that finds nothing below what the consumer may fetch.
        past_hw = timestamp_ms >= 0 and (found is None or found[0] >= fetchable)
        # A new leader's high watermark lags the start of its epoch until its followers fetch
        # again: until then it cannot say where the committed end is (retriable for clients).
        if self.leader_epoch_start_offset > hw and (timestamp_ms == LATEST_TIMESTAMP or past_hw):
            raise KafkaError(
                ErrorCode.offset_not_available,
                f"{self.topic_partition}: high watermark {hw} lags the start of leader epoch "
                f"{self.leader_epoch} at {self.leader_epoch_start_offset}",
            )
        if found is None or past_hw:
            return None
        offset, timestamp, epoch = found
        return OffsetAndEpoch(min(offset, fetchable), timestamp, epoch)

    def last_offset_for_leader_epoch(
        self, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[int, int]:
        self.check_leader(current_leader_epoch)
        return self.log.end_offset_for_epoch(leader_epoch)
