"""`TransactionMetadata`: one transactional id's state at its coordinator, and its state
machine (Kafka's `TransactionMetadata`, `TransactionState`).

A change is prepared (`prepare_*`: a `TxnTransitMetadata`, the state set pending), written
to `__transaction_state`, and only then applied (`complete_transition`); while one is
pending, any other request gets CONCURRENT_TRANSACTIONS. Not shared between tasks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from tierbroker.storage.topic_partition import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# Kafka keeps Short.MaxValue to fence with: an epoch at MaxValue - 1 rotates the producer id.
MAX_PRODUCER_EPOCH = 2**15 - 1


class TransactionState(enum.IntEnum):
    """The `TransactionStatus` byte of the log value."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    # 7, Kafka's PrepareEpochFence, is never written: `prepare_fence_and_abort` does its work.

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use (Kafka's `TransactionState`)."""
        return "".join(word.title() for word in self.name.split("_"))

    @property
    def is_prepare(self) -> bool:
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @property
    def is_complete_or_empty(self) -> bool:
        return self in (
            TransactionState.EMPTY,
            TransactionState.COMPLETE_COMMIT,
            TransactionState.COMPLETE_ABORT,
        )


S = TransactionState
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnTransitMetadata:
    """What a prepared change makes of the metadata once it is written."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int


@dataclass(slots=True, kw_only=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    last_producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    timeout_ms: int
    state: TransactionState = TransactionState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int
    pending_state: TransactionState | None = None

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= MAX_PRODUCER_EPOCH - 1

    def _prepare(
        self,
        state: TransactionState,
        *,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
        last_producer_epoch: int | None = None,
        timeout_ms: int | None = None,
        partitions: frozenset[TopicPartition] | None = None,
        start_ms: int | None = None,
        now_ms: int,
    ) -> TxnTransitMetadata:
        if self.pending_state is not None:
            raise ValueError(f"{self.transactional_id}: {self.pending_state.name} is pending")
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise ValueError(f"{self.transactional_id}: {self.state.name} -> {state.name}")
        self.pending_state = state
        return TxnTransitMetadata(
            producer_id=self.producer_id if producer_id is None else producer_id,
            last_producer_id=self.last_producer_id,
            producer_epoch=self.producer_epoch if producer_epoch is None else producer_epoch,
            last_producer_epoch=(
                self.last_producer_epoch if last_producer_epoch is None else last_producer_epoch
            ),
            timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
            state=state,
            partitions=frozenset(self.partitions) if partitions is None else partitions,
            start_ms=self.start_ms if start_ms is None else start_ms,
            last_update_ms=now_ms,
        )

    def prepare_increment_producer_epoch(
        self, timeout_ms: int, expected_epoch: int | None, now_ms: int
    ) -> TxnTransitMetadata | None:
        """InitProducerId: the next epoch; a retry of the last bump keeps the current one.
        None if `expected_epoch` (KIP-360) is neither: the caller answers PRODUCER_FENCED."""
        if expected_epoch is None or expected_epoch in (NO_PRODUCER_EPOCH, self.producer_epoch):
            epoch, last = self.producer_epoch + 1, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last = self.producer_epoch, self.last_producer_epoch
        else:
            return None
        return self._prepare(
            S.EMPTY,
            producer_epoch=epoch,
            last_producer_epoch=last,
            timeout_ms=timeout_ms,
            partitions=frozenset(),
            start_ms=-1,
            now_ms=now_ms,
        )

    def prepare_producer_id_rotation(
        self, producer_id: int, timeout_ms: int, now_ms: int, record_last_epoch: bool
    ) -> TxnTransitMetadata:
        """InitProducerId once the epoch is exhausted: a new producer id at epoch 0."""
        transit = self._prepare(
            S.EMPTY,
            producer_id=producer_id,
            producer_epoch=0,
            last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            timeout_ms=timeout_ms,
            partitions=frozenset(),
            start_ms=-1,
            now_ms=now_ms,
        )
        return replace(transit, last_producer_id=self.producer_id)

    def prepare_fence_and_abort(self, now_ms: int) -> TxnTransitMetadata:
        """A new producer instance, or a timeout, while a transaction is open: the epoch is
        bumped (never returned to a client) and the transaction aborted at it, so the
        markers fence the old instance (Kafka's PrepareEpochFence, then PrepareAbort)."""
        return self._prepare(
            S.PREPARE_ABORT,
            producer_epoch=self.producer_epoch + 1,
            last_producer_epoch=NO_PRODUCER_EPOCH,
            now_ms=now_ms,
        )

    def prepare_add_partitions(self, added: set[TopicPartition], now_ms: int) -> TxnTransitMetadata:
        start = now_ms if self.state.is_complete_or_empty else self.start_ms
        return self._prepare(
            S.ONGOING,
            partitions=frozenset(self.partitions | added),
            start_ms=start,
            now_ms=now_ms,
        )

    def prepare_abort_or_commit(self, state: TransactionState, now_ms: int) -> TxnTransitMetadata:
        return self._prepare(state, now_ms=now_ms)

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        state = S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return self._prepare(state, partitions=frozenset(), now_ms=now_ms)

    def prepare_dead(self, now_ms: int) -> TxnTransitMetadata:
        return self._prepare(S.DEAD, partitions=frozenset(), now_ms=now_ms)

    def complete_transition(self, transit: TxnTransitMetadata) -> None:
        """Apply a written change."""
        if self.pending_state != transit.state:
            raise ValueError(
                f"{self.transactional_id}: completing {transit.state.name}, "
                f"pending {self.pending_state}"
            )
        self.producer_id = transit.producer_id
        self.last_producer_id = transit.last_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.state = transit.state
        self.partitions = set(transit.partitions)
        self.start_ms = transit.start_ms
        self.last_update_ms = transit.last_update_ms
        self.pending_state = None
