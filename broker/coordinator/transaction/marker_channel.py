"""`TransactionMarkerChannelManager`: sends a decided transaction's markers to the leaders of
its partitions (WriteTxnMarkers, acks=all), retried until each is written (Kafka's
`TransactionMarkerChannelManager` and its completion handler).

One task per transaction, owned here: each round groups the partitions left by their
leader now, writes those led here directly and sends the others one WriteTxnMarkers
request per leader, all at once. A partition is done when written, or when its topic is
gone; leadership moving, a leader unreachable and too few replicas are retried after
`retry_backoff_ms`; INVALID_PRODUCER_EPOCH and TRANSACTION_COORDINATOR_FENCED mean a
newer coordinator or producer took over, and the task stops there without completing.
Once every partition is done the task hands over to `on_written` (the coordinator writes
CompleteCommit or CompleteAbort). An unexpected error writing through one leader (a
malformed answer, a bug) is logged and its partitions retried like the others: a
transaction left prepared would hold its producer at CONCURRENT_TRANSACTIONS. A task
that still fails is logged; the coordinator's next load sends its markers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kio.schema.types import ProducerId, TopicName
from kio.schema.write_txn_markers.v2 import request as markers_request
from kio.static.primitive import i8, i16, i32

from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.network.broker_client import BrokerUnavailable
from tierbroker.broker.network.inter_broker import InterBrokerChannel, InterBrokerClients
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records.control import ControlRecordType, EndTxnMarker
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

_STOP = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.transaction_coordinator_fenced})


@dataclass(frozen=True, slots=True)
class TxnMarkers:
    """The markers of one decided transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]
    transaction_version: int  # the client's: 2 ends at a bumped epoch

    @property
    def marker(self) -> EndTxnMarker:
        kind = ControlRecordType.COMMIT if self.committed else ControlRecordType.ABORT
        return EndTxnMarker(kind, self.coordinator_epoch)


class TransactionMarkerChannelManager:
    def __init__(
        self,
        replicas: ReplicaManager,
        cache: MetadataCache,
        request_timeout_ms: int,
        channel: InterBrokerChannel,
        retry_backoff_ms: int = 100,
    ) -> None:
        self.replicas = replicas
        self.cache = cache
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_s = retry_backoff_ms / 1000
        self._clients = InterBrokerClients(
            channel, cache, f"broker-{replicas.broker_id}", request_timeout_ms
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def send(
        self,
        markers: TxnMarkers,
        still_valid: Callable[[], bool],
        on_written: Callable[[], Awaitable[None]],
    ) -> None:
        """Write `markers` in a task of their own; `still_valid` is asked before each round
        (the coordinator still owns the transaction at this epoch)."""
        task = asyncio.get_running_loop().create_task(
            self._run(markers, still_valid, on_written),
            name=f"txn-markers-{markers.transactional_id}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s failed; the next coordinator load sends its markers again",
                task.get_name(),
                exc_info=task.exception(),
            )

    async def _run(
        self,
        markers: TxnMarkers,
        still_valid: Callable[[], bool],
        on_written: Callable[[], Awaitable[None]],
    ) -> None:
        left = set(markers.partitions)
        while left:
            if not still_valid():
                log.info(
                    "%s: no longer coordinated here; its markers stop", markers.transactional_id
                )
                return
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in list(left):
                if tp.topic not in self.cache.topics:
                    left.discard(tp)  # deleted: nothing to mark, as Kafka drops it
                    continue
                by_leader.setdefault(self.cache.leader(tp), []).append(tp)
            groups = list(by_leader.items())
            rounds = await asyncio.gather(
                *(self._write(leader, markers, tps) for leader, tps in groups),
                return_exceptions=True,
            )
            for (leader, _), errors in zip(groups, rounds, strict=True):
                if isinstance(errors, BaseException):  # a bug or a peer's bad answer
                    log.error(
                        "%s: writing markers through broker %d failed; retrying",
                        markers.transactional_id,
                        leader,
                        exc_info=errors,
                    )
                    continue
                for tp, error in errors.items():
                    if error == ErrorCode.none:
                        left.discard(tp)
                    elif error in _STOP:
                        log.warning(
                            "%s: marker to %s refused with %s: a newer coordinator or producer "
                            "took over",
                            markers.transactional_id,
                            tp,
                            error.name,
                        )
                        return
            if left:
                await asyncio.sleep(self.retry_backoff_s)
        await on_written()

    async def _write(
        self, leader: int, markers: TxnMarkers, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        if leader == self.replicas.broker_id:
            return await self.replicas.write_txn_marker(
                markers.producer_id,
                markers.producer_epoch,
                markers.marker,
                partitions,
                self.request_timeout_ms,
                markers.transaction_version,
            )
        client = self._clients.for_broker(leader)
        if client is None:
            return dict.fromkeys(partitions, ErrorCode.not_leader_or_follower)
        try:
            response = await client.send(_request(markers, partitions))
        except BrokerUnavailable as e:
            log.info("%s: markers to broker %d: %s", markers.transactional_id, leader, e)
            return dict.fromkeys(partitions, ErrorCode.not_leader_or_follower)
        return {
            TopicPartition(topic.name, p.partition_index): ErrorCode(p.error_code)
            for result in response.markers
            for topic in result.topics
            for p in topic.partitions
        }

    async def close(self) -> None:
        """Stop every task (the next coordinator sends their markers) and the connections."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._clients.close()


def _request(
    markers: TxnMarkers, partitions: list[TopicPartition]
) -> markers_request.WriteTxnMarkersRequest:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return markers_request.WriteTxnMarkersRequest(
        markers=(
            markers_request.WritableTxnMarker(
                producer_id=ProducerId(markers.producer_id),
                producer_epoch=i16(markers.producer_epoch),
                transaction_result=markers.committed,
                topics=tuple(
                    markers_request.WritableTxnMarkerTopic(
                        name=TopicName(topic), partition_indexes=tuple(i32(p) for p in indexes)
                    )
                    for topic, indexes in by_topic.items()
                ),
                coordinator_epoch=i32(markers.coordinator_epoch),
                transaction_version=i8(markers.transaction_version),
            ),
        )
    )
