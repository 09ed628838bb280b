"""Producers: InitProducerId for idempotent and transactional producers, and
DescribeProducers.

A transactional id goes to its transaction coordinator; PRODUCER_FENCED is
INVALID_PRODUCER_EPOCH for requests below v4, which know no other code for it.

With an authorizer, as Kafka: a transactional producer needs WRITE on its transactional
id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), an idempotent one IDEMPOTENT_WRITE on the
cluster or WRITE on some topic (CLUSTER_AUTHORIZATION_FAILED); DescribeProducers READ
on the topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import logging
from typing import Any

from tierbroker.broker.handlers.authorize import (
    Op,
    authorized_by_resource_type,
    authorized_cluster,
    require,
    unauthorized,
)
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.handlers.transactions import fenced_as
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


async def handle_init_producer_id(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    if denied := _init_refused(ctx, body.transactional_id):
        return make(
            m.InitProducerIdResponse,
            throttle_time=NO_THROTTLE,
            error_code=denied,
            producer_id=-1,
            producer_epoch=-1,
        )
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


def _init_refused(ctx: BrokerContext, transactional_id: str | None) -> ErrorCode | None:
    if transactional_id is not None:
        return unauthorized(ctx, Op.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    if authorized_cluster(ctx, Op.IDEMPOTENT_WRITE) or authorized_by_resource_type(
        ctx, Op.WRITE, ResourceType.TOPIC
    ):
        return None
    return ErrorCode.cluster_authorization_failed


async def handle_describe_producers(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for index in topic.partition_indexes:
            try:
                require(ctx, Op.READ, ResourceType.TOPIC, topic.name)
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
