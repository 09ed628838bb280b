"""`TransactionMetadata`: one transactional id's state at its coordinator, and its state
machine (Kafka's `TransactionMetadata`, `TransactionState`).

A change is prepared (`prepare_*`: a `TxnTransitMetadata`, the state set pending), written
to `__transaction_state`, and only then applied (`complete_transition`); while one is
pending, any other request gets CONCURRENT_TRANSACTIONS. Not shared between tasks.

With transactions v2 (KIP-890 part 2: a client's `transaction.version` 2) every
transaction ends at a bumped epoch: its markers fence whatever its producer wrote before,
and the next transaction starts at that epoch. The last epoch of a producer id ends its
transaction with the id rotated to `next_producer_id`, at epoch 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from tierbroker.storage.topic_partition import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
TV_2 = 2  # the transaction.version from which a transaction's end bumps the epoch
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
    # Transactions v2 may abort with no transaction open: from the empty and complete states.
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnTransitMetadata:
    """What a prepared change makes of the metadata once it is written."""

    producer_id: int
    last_producer_id: int
    next_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int
    client_transaction_version: int


@dataclass(slots=True, kw_only=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    last_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID  # v2: the id the ending transaction rotates to
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    timeout_ms: int
    state: TransactionState = TransactionState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int
    client_transaction_version: int = 0  # of the client's last request that changed the state
    pending_state: TransactionState | None = None

    @property
    def busy(self) -> bool:
        """A change is being written, or a transaction ends: others wait their turn."""
        return self.pending_state is not None or self.state.is_prepare

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
        next_producer_id: int | None = None,
        client_transaction_version: int | None = None,
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
            next_producer_id=(
                self.next_producer_id if next_producer_id is None else next_producer_id
            ),
            producer_epoch=self.producer_epoch if producer_epoch is None else producer_epoch,
            last_producer_epoch=(
                self.last_producer_epoch if last_producer_epoch is None else last_producer_epoch
            ),
            timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
            state=state,
            partitions=frozenset(self.partitions) if partitions is None else partitions,
            start_ms=self.start_ms if start_ms is None else start_ms,
            last_update_ms=now_ms,
            client_transaction_version=(
                self.client_transaction_version
                if client_transaction_version is None
                else client_transaction_version
            ),
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
        markers fence the old instance (Kafka's PrepareEpochFence, then PrepareAbort). At
        the last epoch there is none to bump to: the abort goes through at it."""
        return self._prepare(
            S.PREPARE_ABORT,
            producer_epoch=min(self.producer_epoch + 1, MAX_PRODUCER_EPOCH),
            last_producer_epoch=NO_PRODUCER_EPOCH,
            now_ms=now_ms,
        )

    def prepare_add_partitions(
        self, added: set[TopicPartition], now_ms: int, client_transaction_version: int
    ) -> TxnTransitMetadata:
        start = now_ms if self.state.is_complete_or_empty else self.start_ms
        return self._prepare(
            S.ONGOING,
            partitions=frozenset(self.partitions | added),
            start_ms=start,
            client_transaction_version=client_transaction_version,
            now_ms=now_ms,
        )

    def prepare_abort_or_commit(
        self,
        state: TransactionState,
        now_ms: int,
        client_transaction_version: int,
        next_producer_id: int = NO_PRODUCER_ID,
    ) -> TxnTransitMetadata:
        """EndTxn. Transactions v2 end at the next epoch (at the last one, an abort that
        must go through keeps it), and may abort when none is open: that abort starts now."""
        epoch, last = self.producer_epoch, self.last_producer_epoch
        if client_transaction_version >= TV_2:
            if not (epoch == MAX_PRODUCER_EPOCH and state == S.PREPARE_ABORT):
                epoch += 1
            last = self.producer_epoch
        return self._prepare(
            state,
            producer_epoch=epoch,
            last_producer_epoch=last,
            start_ms=None if self.state == S.ONGOING else now_ms,
            next_producer_id=next_producer_id,
            client_transaction_version=client_transaction_version,
            now_ms=now_ms,
        )

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        """The markers are written. Transactions v2 at an exhausted epoch move to the next
        producer id, at epoch 0."""
        state = S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        rotate = self.client_transaction_version >= TV_2 and self.next_producer_id != NO_PRODUCER_ID
        transit = self._prepare(
            state,
            producer_id=self.next_producer_id if rotate else None,
            producer_epoch=0 if rotate else None,
            partitions=frozenset(),
            next_producer_id=NO_PRODUCER_ID,
            now_ms=now_ms,
        )
        return replace(transit, last_producer_id=self.producer_id) if rotate else transit

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
        self.next_producer_id = transit.next_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.state = transit.state
        self.partitions = set(transit.partitions)
        self.start_ms = transit.start_ms
        self.last_update_ms = transit.last_update_ms
        self.client_transaction_version = transit.client_transaction_version
        self.pending_state = None
