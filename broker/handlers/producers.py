"""Producers: InitProducerId for idempotent and transactional producers, and
DescribeProducers.

A transactional id goes to its transaction coordinator; PRODUCER_FENCED is
INVALID_PRODUCER_EPOCH for requests below v4, which know no other code for it.
"""

from __future__ import annotations

import logging
from typing import Any

from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.handlers.transactions import fenced_as
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


async def handle_init_producer_id(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    if body.transactional_id is not None:
        result = await ctx.transactions.init_producer_id(
            body.transactional_id,
            int(body.transaction_timeout.total_seconds() * 1000),
            field(body, "producer_id", -1),
            field(body, "producer_epoch", -1),
        )
        return make(
            m.InitProducerIdResponse,
            throttle_time=NO_THROTTLE,
            error_code=fenced_as(result.error, request.api_version, 4),
            producer_id=result.producer_id,
            producer_epoch=result.producer_epoch,
        )
    # An idempotent producer always gets a fresh id at epoch 0, as Kafka gives it.
    try:
        producer_id = await ctx.admin.next_producer_id()
    except KafkaError as e:
        # Clients know no storage error here; this one they retry, as Kafka answers while
        # it cannot allocate ids.
        log.warning("InitProducerId answered COORDINATOR_NOT_AVAILABLE: %s", e)
        return make(
            m.InitProducerIdResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.coordinator_not_available,
            producer_id=-1,
            producer_epoch=-1,
        )
    return make(
        m.InitProducerIdResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        producer_id=producer_id,
        producer_epoch=0,
    )


async def handle_describe_producers(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for index in topic.partition_indexes:
            try:
                state = ctx.replicas.partition_or_error(
                    TopicPartition(topic.name, index)
                ).log.producer_state
            except KafkaError as e:
                partitions.append(
                    make(
                        m.PartitionResponse,
                        partition_index=index,
                        error_code=e.code,
                        error_message=str(e.args[0]),
                        active_producers=(),
                    )
                )
                continue
            producers = tuple(
                make(
                    m.ProducerState,
                    producer_id=entry.producer_id,
                    producer_epoch=entry.epoch,
                    last_sequence=entry.last_seq,
                    last_timestamp=entry.last_timestamp,
                    coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.current_txn_first_offset,
                )
                for entry in state.producers.values()
            )
            partitions.append(
                make(
                    m.PartitionResponse,
                    partition_index=index,
                    error_code=ErrorCode.none,
                    error_message=None,
                    active_producers=producers,
                )
            )
        topics.append(make(m.TopicResponse, name=topic.name, partitions=tuple(partitions)))
    return make(m.DescribeProducersResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
