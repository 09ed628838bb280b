"""What a partition leader asks of a transaction's coordinator before appending the
transaction's first batch to a partition (KIP-890), and what the producer is told when
the coordinator does not confirm it (Kafka's `AddPartitionsToTxnManager` and the
callback of its `ReplicaManager`)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition


class TransactionSupportedOperation(enum.Enum):
    """What the request appending the batch allows: which errors its client knows, and
    whether the partition joins the transaction without AddPartitionsToTxn."""

    DEFAULT_ERROR = enum.auto()  # a partition not in the transaction: INVALID_TXN_STATE
    GENERIC_ERROR_SUPPORTED = enum.auto()  # TRANSACTION_ABORTABLE instead
    ADD_PARTITION = enum.auto()  # transactions v2: the coordinator adds the partition

    @staticmethod
    def of_produce(version: int) -> TransactionSupportedOperation:
        return _by_version(version, adds_from=12)

    @staticmethod
    def of_txn_offset_commit(version: int) -> TransactionSupportedOperation:
        return _by_version(version, adds_from=5)

    @property
    def adds(self) -> bool:
        return self is TransactionSupportedOperation.ADD_PARTITION


def _by_version(version: int, adds_from: int) -> TransactionSupportedOperation:
    if version >= adds_from:
        return TransactionSupportedOperation.ADD_PARTITION
    if version == adds_from - 1:
        return TransactionSupportedOperation.GENERIC_ERROR_SUPPORTED
    return TransactionSupportedOperation.DEFAULT_ERROR


TransactionVerifier = Callable[
    [str, int, int, set[TopicPartition], bool], Awaitable[dict[TopicPartition, ErrorCode]]
]
"""(transactional id, producer id, epoch, partitions, add) -> each partition's error."""

# Retriable answers become NOT_ENOUGH_REPLICAS, which every producer retries.
_RETRIABLE = frozenset(
    {
        ErrorCode.concurrent_transactions,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.request_timed_out,
    }
)


# What a coordinator answers that a client must see as it is (TxnOffsetCommit passes them on).
TRANSACTION_ERRORS = frozenset(
    {
        ErrorCode.invalid_txn_state,
        ErrorCode.invalid_producer_epoch,
        ErrorCode.invalid_producer_id_mapping,
        ErrorCode.transaction_abortable,
    }
)


def producer_error(error: ErrorCode, operation: TransactionSupportedOperation) -> ErrorCode:
    """The coordinator's answer `error` as the appending request's client is told it."""
    if error in _RETRIABLE:
        return ErrorCode.not_enough_replicas
    if error == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    if (
        error == ErrorCode.transaction_abortable
        and operation is TransactionSupportedOperation.DEFAULT_ERROR
    ):
        return ErrorCode.invalid_txn_state
    return error
