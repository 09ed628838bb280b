"""Transactions: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and TxnOffsetCommit from
producers, WriteTxnMarkers from transaction coordinators (and Kafka's admin tools),
DescribeTransactions and ListTransactions (KIP-664) for operators.

Clients that send old versions know no PRODUCER_FENCED: as Kafka does, they are told
INVALID_PRODUCER_EPOCH instead (AddPartitionsToTxn, AddOffsetsToTxn and EndTxn below v2).

With an authorizer, as Kafka: a producer's requests need WRITE on its transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then WRITE on the topics it adds, READ on the
group and the topics it commits offsets of; brokers' requests (AddPartitionsToTxn v4+,
WriteTxnMarkers) need CLUSTER_ACTION (CLUSTER_AUTHORIZATION_FAILED); DescribeTransactions
DESCRIBE on the transactional id, and ListTransactions lists only those.
"""

from __future__ import annotations

import datetime
import logging
import re
from typing import Any

from tierbroker.broker.coordinator.group.offsets_store import OFFSETS_TOPIC
from tierbroker.broker.coordinator.group.records import OffsetValue
from tierbroker.broker.coordinator.transaction.metadata import TV_2, TransactionState
from tierbroker.broker.handlers.authorize import (
    Op,
    authorized,
    authorized_topics,
    unauthorized,
    unauthorized_cluster,
)
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.replication.transaction_verification import (
    TransactionSupportedOperation,
)
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records.control import ControlRecordType, EndTxnMarker
from tierbroker.storage.log import now_ms
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


def fenced_as(error: ErrorCode, version: int, since: int) -> ErrorCode:
    """PRODUCER_FENCED as a request of `version` knows it (the code came in `since`)."""
    if error == ErrorCode.producer_fenced and version < since:
        return ErrorCode.invalid_producer_epoch
    return error


async def handle_add_partitions_to_txn(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    """From producers (v0-3), or from partition leaders (v4+): checking a transaction has
    a partition (VerifyOnly: KIP-890 part 1) or adding it (transactions v2, part 2)."""
    m = response_module(request.api_key, request.api_version)
    body = request.body
    if request.api_version >= 4:
        denied = unauthorized_cluster(ctx, Op.CLUSTER_ACTION)
        return make(
            m.AddPartitionsToTxnResponse,
            throttle_time=NO_THROTTLE,
            error_code=denied or ErrorCode.none,
            results_by_transaction=()
            if denied
            else tuple([await _verify_or_add(ctx, m, txn) for txn in body.transactions]),
        )
    wanted = {TopicPartition(t.name, p) for t in body.v3_and_below_topics for p in t.partitions}
    writable = authorized_topics(ctx, Op.WRITE, {tp.topic for tp in wanted})
    # As Kafka: unauthorized or unknown partitions fail the request, the others are not
    # attempted.
    failed = {
        tp: ErrorCode.topic_authorization_failed
        if tp.topic not in writable
        else ErrorCode.unknown_topic_or_partition
        for tp in wanted
        if tp.topic not in writable or not _exists(ctx, tp)
    }
    txn_denied = unauthorized(
        ctx, Op.WRITE, ResourceType.TRANSACTIONAL_ID, body.v3_and_below_transactional_id
    )
    if txn_denied:
        errors = dict.fromkeys(wanted, txn_denied)
    elif failed:
        errors = {tp: failed.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
    else:
        error = await ctx.transactions.add_partitions(
            body.v3_and_below_transactional_id,
            body.v3_and_below_producer_id,
            body.v3_and_below_producer_epoch,
            wanted,
        )
        errors = dict.fromkeys(wanted, fenced_as(error, request.api_version, 2))
    return make(
        m.AddPartitionsToTxnResponse,
        throttle_time=NO_THROTTLE,
        results_by_topic_v3_and_below=_topic_results(m, errors),
    )


async def _verify_or_add(ctx: BrokerContext, m: Any, txn: Any) -> Any:
    wanted = {TopicPartition(t.name, p) for t in txn.topics for p in t.partitions}
    coordinator = ctx.transactions
    if txn.verify_only:
        errors = coordinator.verify(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted
        )
    else:  # a leader adding a transaction's partition for a client of transactions v2
        error = await coordinator.add_partitions(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted, TV_2
        )
        errors = dict.fromkeys(wanted, error)
    return make(
        m.AddPartitionsToTxnResult,
        transactional_id=txn.transactional_id,
        topic_results=_topic_results(m, errors),
    )


def _topic_results(m: Any, errors: dict[TopicPartition, ErrorCode]) -> tuple[Any, ...]:
    by_topic: dict[str, list[TopicPartition]] = {}
    for tp in sorted(errors):
        by_topic.setdefault(tp.topic, []).append(tp)
    return tuple(
        make(
            m.AddPartitionsToTxnTopicResult,
            name=topic,
            results_by_partition=tuple(
                make(
                    m.AddPartitionsToTxnPartitionResult,
                    partition_index=tp.partition,
                    partition_error_code=errors[tp],
                )
                for tp in tps
            ),
        )
        for topic, tps in by_topic.items()
    )


async def handle_add_offsets_to_txn(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    error = await _add_offsets(ctx, body)
    return make(
        m.AddOffsetsToTxnResponse,
        throttle_time=NO_THROTTLE,
        error_code=fenced_as(error, request.api_version, 2),
    )


async def _add_offsets(ctx: BrokerContext, body: Any) -> ErrorCode:
    if denied := unauthorized(
        ctx, Op.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
    ) or unauthorized(ctx, Op.READ, ResourceType.GROUP, body.group_id):
        return denied
    try:
        await ctx.groups.store.ensure_topic()
    except KafkaError as e:
        log.info("AddOffsetsToTxn for group %r: %s", body.group_id, e)
        return ErrorCode.coordinator_not_available
    offsets = TopicPartition(OFFSETS_TOPIC, ctx.groups.store.partition_of(body.group_id))
    return await ctx.transactions.add_partitions(
        body.transactional_id, body.producer_id, body.producer_epoch, {offsets}
    )


async def handle_end_txn(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    """EndTxn; v5 is transactions v2's: the answer names the producer id and epoch the
    producer goes on with."""
    m = response_module(request.api_key, request.api_version)
    body = request.body
    if denied := unauthorized(ctx, Op.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        return make(
            m.EndTxnResponse,
            throttle_time=NO_THROTTLE,
            error_code=denied,
            producer_id=-1,
            producer_epoch=-1,
        )
    result = await ctx.transactions.end_transaction(
        body.transactional_id,
        body.producer_id,
        body.producer_epoch,
        body.committed,
        TV_2 if request.api_version >= 5 else 0,
    )
    return make(
        m.EndTxnResponse,
        throttle_time=NO_THROTTLE,
        error_code=fenced_as(result.error, request.api_version, 2),
        producer_id=result.producer_id,
        producer_epoch=result.producer_epoch,
    )


async def handle_txn_offset_commit(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    now = now_ms()
    offsets = {
        TopicPartition(t.name, p.partition_index): OffsetValue(
            p.committed_offset,
            field(p, "committed_leader_epoch", -1),
            p.committed_metadata or "",
            now,
        )
        for t in body.topics
        for p in t.partitions
    }
    results: dict[TopicPartition, ErrorCode]
    if denied := unauthorized(
        ctx, Op.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
    ) or unauthorized(ctx, Op.READ, ResourceType.GROUP, body.group_id):
        results = dict.fromkeys(offsets, denied)
    else:
        readable = authorized_topics(ctx, Op.READ, {tp.topic for tp in offsets})
        results = {
            tp: ErrorCode.topic_authorization_failed for tp in offsets if tp.topic not in readable
        }
        results.update(
            await ctx.groups.offsets.commit_transactional(
                body.group_id,
                field(body, "member_id", ""),
                field(body, "group_instance_id"),
                field(body, "generation_id", -1),
                body.transactional_id,
                body.producer_id,
                body.producer_epoch,
                {tp: v for tp, v in offsets.items() if tp not in results},
                TransactionSupportedOperation.of_txn_offset_commit(request.api_version),
            )
        )
    return make(
        m.TxnOffsetCommitResponse,
        throttle_time=NO_THROTTLE,
        topics=tuple(
            make(
                m.TxnOffsetCommitResponseTopic,
                name=t.name,
                partitions=tuple(
                    make(
                        m.TxnOffsetCommitResponsePartition,
                        partition_index=p.partition_index,
                        error_code=results[TopicPartition(t.name, p.partition_index)],
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        ),
    )


async def handle_write_txn_markers(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    results = []
    denied = unauthorized_cluster(ctx, Op.CLUSTER_ACTION)
    for marker in request.body.markers:
        kind = ControlRecordType.COMMIT if marker.transaction_result else ControlRecordType.ABORT
        partitions = [TopicPartition(t.name, p) for t in marker.topics for p in t.partition_indexes]
        if denied:
            errors = dict.fromkeys(partitions, denied)
        else:
            errors = await ctx.replicas.write_txn_marker(
                marker.producer_id,
                marker.producer_epoch,
                EndTxnMarker(kind, marker.coordinator_epoch),
                partitions,
                ctx.config.request_timeout_ms,
                field(marker, "transaction_version", 0),
            )
        results.append(
            make(
                m.WritableTxnMarkerResult,
                producer_id=marker.producer_id,
                topics=tuple(
                    make(
                        m.WritableTxnMarkerTopicResult,
                        name=t.name,
                        partitions=tuple(
                            make(
                                m.WritableTxnMarkerPartitionResult,
                                partition_index=p,
                                error_code=errors[TopicPartition(t.name, p)],
                            )
                            for p in t.partition_indexes
                        ),
                    )
                    for t in marker.topics
                ),
            )
        )
    return make(m.WriteTxnMarkersResponse, markers=tuple(results))


def _exists(ctx: BrokerContext, tp: TopicPartition) -> bool:
    return tp.topic in ctx.metadata.topics and tp.partition < ctx.metadata.partition_count(tp.topic)


_STATES = {s.kafka_name: s for s in TransactionState}


async def handle_describe_transactions(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    m = response_module(request.api_key, request.api_version)
    states = []
    for transactional_id in request.body.transactional_ids:
        if denied := unauthorized(
            ctx, Op.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id
        ):
            error, metadata = denied, None
        else:
            error, metadata = ctx.transactions.describe(transactional_id)
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(metadata.partitions if metadata else ()):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        states.append(
            make(
                m.TransactionState,
                error_code=error,
                transactional_id=transactional_id,
                transaction_state=metadata.state.kafka_name if metadata else "",
                transaction_timeout=datetime.timedelta(
                    milliseconds=metadata.timeout_ms if metadata else 0
                ),
                transaction_start_time=datetime.datetime.fromtimestamp(
                    (metadata.start_ms if metadata else -1) / 1000, datetime.UTC
                ),
                producer_id=metadata.producer_id if metadata else -1,
                producer_epoch=metadata.producer_epoch if metadata else -1,
                topics=tuple(
                    make(m.TopicData, topic=topic, partitions=tuple(partitions))
                    for topic, partitions in by_topic.items()
                ),
            )
        )
    return make(
        m.DescribeTransactionsResponse, throttle_time=NO_THROTTLE, transaction_states=tuple(states)
    )


async def handle_list_transactions(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    unknown = tuple(s for s in body.state_filters if s not in _STATES)
    pattern = field(body, "transactional_id_pattern")
    try:
        compiled = re.compile(pattern) if pattern else None
    except re.error as e:
        log.info("ListTransactions with pattern %r refused: %s", pattern, e)
        return make(
            m.ListTransactionsResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.invalid_regular_expression,
            unknown_state_filters=(),
            transaction_states=(),
        )
    listed = ctx.transactions.list_transactions(
        {_STATES[s] for s in body.state_filters if s in _STATES},
        set(body.producer_id_filters),
        field(body, "duration_filter", -1),
        compiled,
    )
    return make(
        m.ListTransactionsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        unknown_state_filters=unknown,
        transaction_states=tuple(
            make(
                m.TransactionState,
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state.kafka_name,
            )
            for t in listed
            if authorized(
                ctx, Op.DESCRIBE, ResourceType.TRANSACTIONAL_ID, t.transactional_id, False
            )
        ),
    )
