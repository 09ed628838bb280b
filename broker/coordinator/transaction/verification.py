"""`TransactionVerifier`: a partition leader's question to a transaction's coordinator,
whether its open transaction has these partitions (KIP-890 part 1), or, for clients of
transactions v2 (part 2), the request to add them (Kafka's `AddPartitionsToTxnManager`).

Asked of the coordinator here directly, or with an AddPartitionsToTxn v5 request
(VerifyOnly unless adding) to the broker leading the transactional id's
`__transaction_state` partition. A coordinator that cannot be reached answers
COORDINATOR_NOT_AVAILABLE for every partition, which the producer is told to retry.
"""

from __future__ import annotations

import logging

from kio.schema.add_partitions_to_txn.v5 import request as add_request
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32

from tierbroker.broker.coordinator.transaction.coordinator import TransactionCoordinator
from tierbroker.broker.coordinator.transaction.metadata import TV_2
from tierbroker.broker.coordinator.transaction.state_manager import TRANSACTION_STATE_TOPIC
from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.network.broker_client import BrokerUnavailable
from tierbroker.broker.network.inter_broker import InterBrokerChannel, InterBrokerClients
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class TransactionVerifier:
    def __init__(
        self,
        broker_id: int,
        coordinator: TransactionCoordinator,
        cache: MetadataCache,
        request_timeout_ms: int,
        channel: InterBrokerChannel,
    ) -> None:
        self.broker_id = broker_id
        self.coordinator = coordinator
        self.cache = cache
        self._clients = InterBrokerClients(
            channel, cache, f"broker-{broker_id}", request_timeout_ms
        )

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[TopicPartition],
        add: bool,
    ) -> dict[TopicPartition, ErrorCode]:
        """Each partition's error: none if the transaction has it (now, when `add`)."""
        state = self.coordinator.state
        leader = self.cache.leader(
            TopicPartition(TRANSACTION_STATE_TOPIC, state.partition_of(transactional_id))
        )
        if leader == self.broker_id:
            if add:
                error = await self.coordinator.add_partitions(
                    transactional_id, producer_id, producer_epoch, partitions, TV_2
                )
                return dict.fromkeys(partitions, error)
            return self.coordinator.verify(
                transactional_id, producer_id, producer_epoch, partitions
            )
        client = self._clients.for_broker(leader)
        if client is None:
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        try:
            response = await client.send(
                _request(transactional_id, producer_id, producer_epoch, partitions, add)
            )
        except BrokerUnavailable as e:
            log.info("verifying %r with broker %d: %s", transactional_id, leader, e)
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        if response.error_code != ErrorCode.none:
            return dict.fromkeys(partitions, ErrorCode(response.error_code))
        return {
            TopicPartition(topic.name, p.partition_index): ErrorCode(p.partition_error_code)
            for result in response.results_by_transaction
            for topic in result.topic_results
            for p in topic.results_by_partition
        }

    async def close(self) -> None:
        await self._clients.close()


def _request(
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: set[TopicPartition],
    add: bool,
) -> add_request.AddPartitionsToTxnRequest:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return add_request.AddPartitionsToTxnRequest(
        transactions=(
            add_request.AddPartitionsToTxnTransaction(
                transactional_id=TransactionalId(transactional_id),
                producer_id=ProducerId(producer_id),
                producer_epoch=i16(producer_epoch),
                verify_only=not add,
                topics=tuple(
                    add_request.AddPartitionsToTxnTopic(
                        name=TopicName(topic), partitions=tuple(i32(p) for p in indexes)
                    )
                    for topic, indexes in by_topic.items()
                ),
            ),
        ),
    )
