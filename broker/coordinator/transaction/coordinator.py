"""`TransactionCoordinator`: transactional producers' requests, as Kafka's
`TransactionCoordinator` answers them, and partition leaders' checks that a transaction
has a partition (KIP-890 part 1) or requests to add it (part 2, transactions v2).

- InitProducerId gives a transactional id its producer id and the next epoch; the
  previous instance is fenced by that epoch. If a transaction is open, it is aborted at
  a bumped epoch first and the client told CONCURRENT_TRANSACTIONS, to retry.
- AddPartitionsToTxn and AddOffsetsToTxn (the group's `__consumer_offsets` partition)
  add to the open transaction.
- EndTxn writes PrepareCommit or PrepareAbort, answers, then has the markers written
  (`TransactionMarkerChannelManager`) and writes CompleteCommit or CompleteAbort; the
  next transaction waits (CONCURRENT_TRANSACTIONS) until then. With transactions v2
  (EndTxn v5) the transaction ends at the next epoch, which the answer gives the
  producer; a retry is known by the epoch it comes with, one below.
- A transaction open longer than its timeout is aborted at a bumped epoch; an id idle
  for `transactional.id.expiration.ms` is removed.

The coordinator of an id is the leader of its `__transaction_state` partition; a new
leader loads the partition and sends again the markers of prepared transactions.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass

from tierbroker.broker.coordinator.transaction.marker_channel import (
    TransactionMarkerChannelManager,
    TxnMarkers,
)
from tierbroker.broker.coordinator.transaction.metadata import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TV_2,
    TransactionMetadata,
    TransactionState,
)
from tierbroker.broker.coordinator.transaction.state_manager import TransactionStateManager
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log import now_ms
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

S = TransactionState
# How long a leader's implicit add waits out the end of the previous transaction (markers
# being written) before the producer is told to retry: Kafka's leader retries as long
# (add.partitions.to.txn.retry.backoff.max.ms), since a produce retry costs far more.
IMPLICIT_ADD_WAIT_S = 0.1


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class EndTxnResult:
    error: ErrorCode
    producer_id: int = -1  # transactions v2: what the producer goes on with
    producer_epoch: int = -1


class TransactionCoordinator:
    def __init__(
        self,
        state: TransactionStateManager,
        markers: TransactionMarkerChannelManager,
        next_producer_id: Callable[[], Awaitable[int]],
    ) -> None:
        self.state = state
        self.markers = markers
        self.next_producer_id = next_producer_id
        self.config = state.config
        self._tasks: set[asyncio.Task[None]] = set()

    # Lifecycle -----------------------------------------------------------------------

    def on_leadership(self, partition: int, leader: bool, leader_epoch: int) -> None:
        """This broker started (at `leader_epoch`) or stopped leading a partition of
        `__transaction_state`."""
        if leader:
            self.state.loading.add(partition)
            self._run(self._load(partition, leader_epoch), f"load-transactions-{partition}")
        else:
            self.state.loading.discard(partition)
            self.state.unload_partition(partition)

    async def _load(self, partition: int, coordinator_epoch: int) -> None:
        await asyncio.sleep(0)  # after the leadership change that asked for it
        if partition not in self.state.loading:
            return
        for metadata in self.state.load_partition(partition, coordinator_epoch):
            self._send_markers(metadata, coordinator_epoch, metadata.state == S.PREPARE_COMMIT)

    def _run(self, work: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.markers.close()

    # InitProducerId ------------------------------------------------------------------

    async def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected_producer_id: int = -1,
        expected_epoch: int = NO_PRODUCER_EPOCH,
    ) -> InitProducerIdResult:
        """`expected_*`: the producer id and epoch a producer resuming asks to bump (KIP-360)."""
        if not transactional_id:
            return InitProducerIdResult(ErrorCode.invalid_request)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return InitProducerIdResult(ErrorCode.invalid_transaction_timeout)
        error = self.state.coordinator_error(transactional_id)
        if error != ErrorCode.none:
            return InitProducerIdResult(error)
        epoch = self.state.coordinator_epoch(transactional_id)
        assert epoch is not None
        metadata = self.state.metadata.get(transactional_id)
        if metadata is None:
            try:
                producer_id = await self.next_producer_id()
            except KafkaError as e:
                log.warning("InitProducerId of %r: %s", transactional_id, e)
                return InitProducerIdResult(ErrorCode.coordinator_not_available)
            metadata = self.state.metadata.setdefault(
                transactional_id,
                TransactionMetadata(
                    transactional_id=transactional_id,
                    producer_id=producer_id,
                    timeout_ms=timeout_ms,
                    last_update_ms=now_ms(),
                ),
            )
        expected = expected_epoch if expected_producer_id >= 0 else None
        if metadata.busy:
            return InitProducerIdResult(ErrorCode.concurrent_transactions)
        if expected_producer_id >= 0 and expected_producer_id not in (
            metadata.producer_id,
            metadata.last_producer_id,
        ):
            return InitProducerIdResult(ErrorCode.producer_fenced)
        if metadata.state == S.ONGOING:
            # Fence the open transaction's producer and abort it; the client retries.
            error = await self._end(metadata, epoch, committed=False, fence=True)
            return InitProducerIdResult(
                ErrorCode.concurrent_transactions if error == ErrorCode.none else error
            )
        now = now_ms()
        if metadata.epoch_exhausted and expected in (None, metadata.producer_epoch):
            try:
                producer_id = await self.next_producer_id()
            except KafkaError:
                return InitProducerIdResult(ErrorCode.coordinator_not_available)
            if metadata.pending_state is not None:  # another request came meanwhile
                return InitProducerIdResult(ErrorCode.concurrent_transactions)
            transit = metadata.prepare_producer_id_rotation(
                producer_id, timeout_ms, now, expected is not None
            )
        else:
            bumped = metadata.prepare_increment_producer_epoch(timeout_ms, expected, now)
            if bumped is None:
                return InitProducerIdResult(ErrorCode.producer_fenced)
            transit = bumped
        try:
            await self.state.write(metadata, transit, epoch)
        except KafkaError as e:
            return InitProducerIdResult(e.code)
        log.info(
            "transactional id %r: producer %d at epoch %d",
            transactional_id,
            metadata.producer_id,
            metadata.producer_epoch,
        )
        return InitProducerIdResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch)

    # Adding partitions ---------------------------------------------------------------

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[TopicPartition],
        client_transaction_version: int = 0,
    ) -> ErrorCode:
        """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's partition); from a
        partition leader, for transactions v2, the first batch of a transaction there.
        While a transaction ends (its epoch bumped, its id maybe rotated) the producer may
        already use what comes next: it is told to retry first; an implicit add waits for
        that end a while instead."""
        deadline = asyncio.get_running_loop().time() + IMPLICIT_ADD_WAIT_S
        while True:
            metadata, error = self._checked(
                transactional_id, producer_id, producer_epoch, busy_first=True
            )
            left = deadline - asyncio.get_running_loop().time()
            implicit = client_transaction_version >= TV_2
            if error != ErrorCode.concurrent_transactions or not implicit or left <= 0:
                break
            await self.state.changed(left)
        if metadata is None:
            return error
        if metadata.state == S.ONGOING and partitions <= metadata.partitions:
            return ErrorCode.none
        epoch = self.state.coordinator_epoch(transactional_id)
        assert epoch is not None
        transit = metadata.prepare_add_partitions(partitions, now_ms(), client_transaction_version)
        try:
            await self.state.write(metadata, transit, epoch)
        except KafkaError as e:
            return e.code
        return ErrorCode.none

    def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """KIP-890 part 1 (AddPartitionsToTxn v4+, VerifyOnly): whether the producer's open
        transaction has each partition; TRANSACTION_ABORTABLE for one it lacks."""
        metadata, error = self._checked(transactional_id, producer_id, producer_epoch)
        if metadata is not None and metadata.busy:
            error = ErrorCode.concurrent_transactions
        if error != ErrorCode.none or metadata is None:
            return dict.fromkeys(partitions, error)
        ongoing = metadata.state == S.ONGOING
        return {
            tp: ErrorCode.none
            if ongoing and tp in metadata.partitions
            else ErrorCode.transaction_abortable
            for tp in partitions
        }

    def _checked(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        busy_first: bool = False,
    ) -> tuple[TransactionMetadata | None, ErrorCode]:
        """The id's metadata if this broker coordinates it and the producer is its current
        one, else the error (Kafka's order of checks); `busy_first`: CONCURRENT_TRANSACTIONS
        while a change is pending or a transaction ends, before the producer is checked."""
        if not transactional_id:
            return None, ErrorCode.invalid_request
        error = self.state.coordinator_error(transactional_id)
        if error != ErrorCode.none:
            return None, error
        metadata = self.state.metadata.get(transactional_id)
        if busy_first and metadata is not None and metadata.busy:
            return None, ErrorCode.concurrent_transactions
        if metadata is None or metadata.producer_id != producer_id:
            return None, ErrorCode.invalid_producer_id_mapping
        if metadata.producer_epoch != producer_epoch:
            return None, ErrorCode.producer_fenced
        return metadata, ErrorCode.none

    # EndTxn --------------------------------------------------------------------------

    async def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        client_transaction_version: int = 0,
    ) -> EndTxnResult:
        """EndTxn; v5 (transactions v2) ends at a bumped epoch, which the result gives."""
        if client_transaction_version >= TV_2:
            return await self._end_transaction_v2(
                transactional_id, producer_id, producer_epoch, committed
            )
        metadata, error = self._checked(transactional_id, producer_id, producer_epoch)
        if metadata is None:
            return EndTxnResult(error)
        if metadata.pending_state is not None:
            return EndTxnResult(ErrorCode.concurrent_transactions)
        state = metadata.state
        if state == S.ONGOING:
            epoch = self.state.coordinator_epoch(transactional_id)
            assert epoch is not None
            return EndTxnResult(await self._end(metadata, epoch, committed, fence=False))
        done, prepared = (
            (S.COMPLETE_COMMIT, S.PREPARE_COMMIT)
            if committed
            else (S.COMPLETE_ABORT, S.PREPARE_ABORT)
        )
        if state == done:
            return EndTxnResult(ErrorCode.none)  # a retry of the request that ended it
        if state == prepared:
            return EndTxnResult(ErrorCode.concurrent_transactions)
        return EndTxnResult(self._wrong_state(metadata, committed))

    async def _end_transaction_v2(
        self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool
    ) -> EndTxnResult:
        """Kafka's checks for transactions v2. The epoch tells a retry: one below the
        current (the bump done), or the last of a rotated id. An abort needs no open
        transaction (the producer may have sent nothing yet); it too bumps the epoch."""
        if not transactional_id:
            return EndTxnResult(ErrorCode.invalid_request)
        error = self.state.coordinator_error(transactional_id)
        if error != ErrorCode.none:
            return EndTxnResult(error)
        metadata = self.state.metadata.get(transactional_id)
        if metadata is None:
            return EndTxnResult(ErrorCode.invalid_producer_id_mapping)
        if metadata.pending_state is not None:
            return EndTxnResult(ErrorCode.concurrent_transactions)
        retry_on_overflow = (
            metadata.last_producer_id == producer_id
            and producer_epoch == MAX_PRODUCER_EPOCH - 1
            and metadata.producer_epoch == 0
        )
        retry_on_bump = metadata.producer_epoch == producer_epoch + 1
        if metadata.producer_id != producer_id and not retry_on_overflow:
            return EndTxnResult(ErrorCode.invalid_producer_id_mapping)
        state = metadata.state
        current = producer_epoch == metadata.producer_epoch
        valid = {
            S.ONGOING: current,
            S.EMPTY: current,
            S.PREPARE_COMMIT: retry_on_bump,
            S.PREPARE_ABORT: retry_on_bump,
        }.get(state, retry_on_bump or retry_on_overflow or current)
        if not valid:
            return EndTxnResult(ErrorCode.producer_fenced)
        retry = retry_on_bump or retry_on_overflow
        finished = S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT
        if state == finished and retry:
            return EndTxnResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch)
        if state.is_prepare and (state == S.PREPARE_COMMIT) == committed:
            return EndTxnResult(ErrorCode.concurrent_transactions)
        may_end = state == S.ONGOING or (
            not committed and not retry and state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
        )
        if not may_end:
            return EndTxnResult(self._wrong_state(metadata, committed))
        next_producer_id = NO_PRODUCER_ID
        if metadata.epoch_exhausted:
            try:
                next_producer_id = await self.next_producer_id()
            except KafkaError as e:
                log.warning("EndTxn of %r: %s", transactional_id, e)
                return EndTxnResult(ErrorCode.coordinator_not_available)
            if metadata.pending_state is not None:  # another request came meanwhile
                return EndTxnResult(ErrorCode.concurrent_transactions)
        epoch = self.state.coordinator_epoch(transactional_id)
        assert epoch is not None
        error = await self._end(
            metadata,
            epoch,
            committed,
            fence=False,
            client_transaction_version=TV_2,
            next_producer_id=next_producer_id,
        )
        if error != ErrorCode.none:
            return EndTxnResult(error)
        if next_producer_id != NO_PRODUCER_ID:
            return EndTxnResult(ErrorCode.none, next_producer_id, 0)
        return EndTxnResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch)

    @staticmethod
    def _wrong_state(metadata: TransactionMetadata, committed: bool) -> ErrorCode:
        log.info(
            "EndTxn(%s) of %r in state %s refused",
            "commit" if committed else "abort",
            metadata.transactional_id,
            metadata.state.name,
        )
        return ErrorCode.invalid_txn_state

    async def _end(
        self,
        metadata: TransactionMetadata,
        coordinator_epoch: int,
        committed: bool,
        fence: bool,
        client_transaction_version: int = 0,
        next_producer_id: int = NO_PRODUCER_ID,
    ) -> ErrorCode:
        """Write PrepareCommit or PrepareAbort (at a bumped epoch to `fence` the producer,
        or for transactions v2), then have the markers sent; the error of the write."""
        now = now_ms()
        transit = (
            metadata.prepare_fence_and_abort(now)
            if fence
            else metadata.prepare_abort_or_commit(
                S.PREPARE_COMMIT if committed else S.PREPARE_ABORT,
                now,
                client_transaction_version,
                next_producer_id,
            )
        )
        try:
            await self.state.write(metadata, transit, coordinator_epoch)
        except KafkaError as e:
            return e.code
        self._send_markers(metadata, coordinator_epoch, committed)
        return ErrorCode.none

    def _send_markers(
        self, metadata: TransactionMetadata, coordinator_epoch: int, committed: bool
    ) -> None:
        transactional_id = metadata.transactional_id
        markers = TxnMarkers(
            transactional_id,
            metadata.producer_id,
            metadata.producer_epoch,
            committed,
            coordinator_epoch,
            frozenset(metadata.partitions),
            metadata.client_transaction_version,
        )

        def still_valid() -> bool:
            return (
                self.state.coordinator_epoch(transactional_id) == coordinator_epoch
                and self.state.metadata.get(transactional_id) is metadata
            )

        async def complete() -> None:
            await self._complete(metadata, coordinator_epoch, still_valid)

        self.markers.send(markers, still_valid, complete)

    async def _complete(
        self,
        metadata: TransactionMetadata,
        coordinator_epoch: int,
        still_valid: Callable[[], bool],
    ) -> None:
        """The markers are written: CompleteCommit or CompleteAbort, retried while this
        broker still coordinates the transaction."""
        while still_valid():
            transit = metadata.prepare_complete(now_ms())
            try:
                await self.state.write(metadata, transit, coordinator_epoch)
                return
            except KafkaError as e:
                log.warning(
                    "%s: writing %s failed (%s); retrying",
                    metadata.transactional_id,
                    transit.state.name,
                    e,
                )
                await asyncio.sleep(self.markers.retry_backoff_s)

    # Describing ----------------------------------------------------------------------

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        """DescribeTransactions: the id's metadata here, or why not."""
        error = self.state.coordinator_error(transactional_id)
        if error != ErrorCode.none:
            return error, None
        metadata = self.state.metadata.get(transactional_id)
        if metadata is None:
            return ErrorCode.transactional_id_not_found, None
        return ErrorCode.none, metadata

    def list_transactions(
        self,
        states: set[TransactionState],
        producer_ids: set[int],
        min_duration_ms: int,
        pattern: re.Pattern[str] | None,
    ) -> list[TransactionMetadata]:
        """ListTransactions: the ids coordinated here that pass every filter given (an
        empty set or -1 passes all; the duration is how long the transaction has run)."""
        now = now_ms()
        return [
            m
            for m in self.state.metadata.values()
            if (not states or m.state in states)
            and (not producer_ids or m.producer_id in producer_ids)
            and (
                min_duration_ms < 0
                or (m.state == S.ONGOING and now - m.start_ms >= min_duration_ms)
            )
            and (pattern is None or pattern.fullmatch(m.transactional_id))
        ]

    # Expiration ----------------------------------------------------------------------

    async def abort_timed_out_transactions(self) -> None:
        """Abort, at a bumped epoch, each transaction open past its timeout."""
        now = now_ms()
        for metadata in list(self.state.metadata.values()):
            if (
                metadata.state == S.ONGOING
                and metadata.pending_state is None
                and metadata.start_ms + metadata.timeout_ms < now
            ):
                epoch = self.state.coordinator_epoch(metadata.transactional_id)
                if epoch is None:
                    continue
                log.info(
                    "aborting the transaction of %r (producer %d): open longer than %d ms",
                    metadata.transactional_id,
                    metadata.producer_id,
                    metadata.timeout_ms,
                )
                error = await self._end(metadata, epoch, committed=False, fence=True)
                if error != ErrorCode.none:
                    log.warning("aborting %r failed: %s", metadata.transactional_id, error.name)

    async def remove_expired_transactional_ids(self) -> None:
        """Remove each id idle (no transaction open) past transactional.id.expiration.ms."""
        horizon = now_ms() - self.config.id_expiration_ms
        for metadata in list(self.state.metadata.values()):
            if (
                metadata.state.is_complete_or_empty
                and metadata.pending_state is None
                and metadata.last_update_ms < horizon
            ):
                epoch = self.state.coordinator_epoch(metadata.transactional_id)
                if epoch is None:
                    continue
                metadata.prepare_dead(now_ms())
                try:
                    await self.state.remove(metadata, epoch)
                except KafkaError as e:
                    log.warning("expiring %r failed: %s", metadata.transactional_id, e)
                    continue
                log.info("transactional id %r expired", metadata.transactional_id)
