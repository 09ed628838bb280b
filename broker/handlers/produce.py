"""Produce: records in, offsets out. Records are handed on as received, never decoded.

A request with a transactional id may carry transactional batches (their producer's
transaction is opened by the first); without one, they are refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka refuses them.

With an authorizer, a transactional request needs WRITE on its transactional id (else
every partition is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and each topic WRITE
(else TOPIC_AUTHORIZATION_FAILED, asked before whether the topic exists, as Kafka does).

A partition whose log dir is below its free-space floor (`FreeSpaceGuard`) is answered
KAFKA_STORAGE_ERROR without an append.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from tierbroker.broker.handlers.authorize import Op, authorized, unauthorized
from tierbroker.broker.handlers.common import NO_THROTTLE, BrokerContext, make, response_module
from tierbroker.broker.metadata.topic_admin import validate_topic_name
from tierbroker.broker.replication.replica_manager import ProduceResult
from tierbroker.broker.replication.transaction_verification import (
    TransactionSupportedOperation,
)
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records.batch import LOG_OVERHEAD, whole_batches_size
from tierbroker.storage.log import AppendOptions
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


async def handle_produce(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    body = request.body
    m = response_module(request.api_key, request.api_version)
    by_id = request.api_version >= 13
    cache = ctx.metadata
    entries: dict[TopicPartition, bytes] = {}
    results: dict[TopicPartition, ProduceResult] = {}
    keys: list[tuple[Any, list[tuple[int, TopicPartition]]]] = []
    txn_refused = (
        unauthorized(ctx, Op.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
        if body.transactional_id is not None
        else None
    )
    for topic in body.topic_data:
        found = cache.topic_by_id(topic.topic_id) if by_id else topic.name
        known = found is not None and found in cache.topics
        name = found if known and found else ("" if by_id else topic.name)
        error = txn_refused
        # Asked before the topic's existence (not told to whoever may not write it); a
        # topic id is looked up first, as it names nothing until found.
        if error is None and (known or not by_id):
            if not authorized(ctx, Op.WRITE, ResourceType.TOPIC, name):
                error = ErrorCode.topic_authorization_failed
        if error is None:
            error = _topic_error(name, known, by_id)
        if error is not None:
            log.info("produce to topic %r refused: %s", name or topic.topic_id, error.name.upper())
        partitions = []
        for p in topic.partition_data:
            tp = TopicPartition(name, p.index)
            partitions.append((p.index, tp))
            if error is not None:
                results[tp] = ProduceResult(error)
            elif body.acks not in (0, 1, -1):
                results[tp] = ProduceResult(ErrorCode.invalid_required_acks)
            elif (reason := _not_one_batch(p.records or b"")) is not None:
                log.info("produce to %s refused: %s", tp, reason)
                results[tp] = ProduceResult(ErrorCode.invalid_record, error_message=reason)
            else:
                entries[tp] = p.records or b""
        keys.append((topic.topic_id if by_id else topic.name, partitions))
    for tp, reason in _short_of_space(ctx, entries).items():
        del entries[tp]
        results[tp] = ProduceResult(ErrorCode.kafka_storage_error, error_message=reason)
    appended = await ctx.replicas.append_records(
        entries,
        body.acks,
        int(body.timeout.total_seconds() * 1000),
        AppendOptions(transactional_id=body.transactional_id),
        TransactionSupportedOperation.of_produce(request.api_version),
    )
    for tp, result in appended.items():
        if result.error == ErrorCode.none:
            ctx.topic_metrics.bytes_in.labels(tp.topic).inc(len(entries[tp]))
    results.update(appended)
    if body.acks == 0:
        return None
    return make(
        m.ProduceResponse,
        responses=tuple(
            make(
                m.TopicProduceResponse,
                name=key,
                topic_id=key,
                partition_responses=tuple(
                    _partition_response(m, index, results[tp]) for index, tp in partitions
                ),
            )
            for key, partitions in keys
        ),
        throttle_time=NO_THROTTLE,
    )


def _short_of_space(
    ctx: BrokerContext, entries: dict[TopicPartition, bytes]
) -> dict[TopicPartition, str]:
    """Partitions whose log dir is below `log.dir.min.free.bytes`, and why they are refused."""
    refused: dict[TopicPartition, str] = {}
    for tp, records in entries.items():
        partition = ctx.replicas.partitions.get(tp)
        if partition is None or not partition.is_leader:
            continue  # the replica manager answers why
        reason = ctx.replicas.log_manager.free_space.refusal(partition.log.dir.parent, len(records))
        if reason is not None:
            refused[tp] = reason
    return refused


def _not_one_batch(records: bytes) -> str | None:
    """Why `records` is not exactly one whole batch, as Produce v3+ requires (Kafka's
    ProduceRequest.validateRecords); None if it is."""
    whole_bytes = whole_batches_size(records)
    if whole_bytes == 0:
        return f"{len(records)} bytes of records hold no whole record batch"
    first_bytes = LOG_OVERHEAD + int.from_bytes(records[8:12], "big", signed=True)
    if whole_bytes > first_bytes:
        return "a partition's records hold more than one record batch"
    return None


def _topic_error(name: str, known: bool, by_id: bool) -> ErrorCode | None:
    if known:
        return None
    if by_id:
        return ErrorCode.unknown_topic_id
    try:
        validate_topic_name(name)
    except KafkaError as e:
        return e.code
    return ErrorCode.unknown_topic_or_partition


def _partition_response(m: Any, index: int, result: ProduceResult) -> Any:
    per_record = getattr(m, "BatchIndexAndErrorMessage", None)  # Produce v8+
    return make(
        m.PartitionProduceResponse,
        index=index,
        error_code=result.error,
        base_offset=result.base_offset,
        log_append_time=(
            None
            if result.log_append_time_ms < 0
            else datetime.datetime.fromtimestamp(result.log_append_time_ms / 1000, datetime.UTC)
        ),
        log_start_offset=result.log_start_offset,
        record_errors=()
        if per_record is None
        else tuple(
            make(per_record, batch_index=i, batch_index_error_message=message)
            for i, message in result.record_errors
        ),
        error_message=result.error_message,
    )
