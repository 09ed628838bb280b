"""Fetch: record sets (local file slices, or batches read from the remote tier) spliced in as bytes.

Sessionless: every response is a full one (session id 0) and lists every requested
partition, empty ones included, as Java and kafka-python clients require.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from tierbroker.broker.handlers.authorize import Op, authorized, authorized_cluster
from tierbroker.broker.handlers.common import (
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.metrics.served_bytes import Tier, direction
from tierbroker.broker.network.request_context import current_request
from tierbroker.broker.replication.fetch_reader import (
    FetchParams,
    FetchRequestPartition,
    FetchResultPartition,
)
from tierbroker.broker.replication.replica_selector import ClientMetadata
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import RecordsSplicer, Request
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition


async def handle_fetch(ctx: BrokerContext, request: Request, splicer: RecordsSplicer) -> Any:
    body = request.body
    m = response_module(request.api_key, request.api_version)
    by_id = request.api_version >= 13
    cache = ctx.metadata
    requested: list[FetchRequestPartition] = []
    layout: list[
        tuple[Any, list[tuple[int, int | ErrorCode]]]
    ] = []  # (topic key, [(partition, index|error)])
    replica_state = field(body, "replica_state")
    # v15+ names a follower in ReplicaState, older versions in ReplicaId.
    replica_id = replica_state.replica_id if replica_state else field(body, "replica_id", -1)
    as_follower = replica_id >= 0
    cluster_action = as_follower and authorized_cluster(ctx, Op.CLUSTER_ACTION)
    for topic in body.topics:
        name = cache.topic_by_id(topic.topic_id) if by_id else topic.topic
        error = _refusal(ctx, name, by_id, as_follower, cluster_action)
        entries: list[tuple[int, int | ErrorCode]] = []
        for p in topic.partitions:
            if error is not None or name is None:
                entries.append((p.partition, error or ErrorCode.unknown_topic_or_partition))
                continue
            entries.append((p.partition, len(requested)))
            requested.append(
                FetchRequestPartition(
                    TopicPartition(name, p.partition),
                    p.fetch_offset,
                    p.partition_max_bytes,
                    field(p, "current_leader_epoch", -1),
                    field(p, "last_fetched_epoch", -1),
                    field(p, "log_start_offset", -1),
                )
            )
        layout.append((topic.topic_id if by_id else topic.topic, entries))
    # From v11 a consumer may be sent to, and read from, another replica (KIP-392).
    client = (
        ClientMetadata(
            field(body, "rack_id", "") or "", request.client_id or "", current_request().client_host
        )
        if request.api_version >= 11
        else None
    )
    max_bytes = field(body, "max_bytes", 2**31 - 1)
    if not as_follower:  # as Kafka: a consumer asks no more than its quota lets through at once
        context = current_request()
        within = ctx.quotas.fetch.max_value_in_window(context.principal.name, context.client_id)
        max_bytes = max_bytes if within is None else max(min(max_bytes, int(within)), 1)
    params = FetchParams(
        max_wait_ms=int(body.max_wait.total_seconds() * 1000),
        min_bytes=min(body.min_bytes, max_bytes),
        max_bytes=max_bytes,
        replica_id=replica_id,
        replica_epoch=replica_state.replica_epoch if replica_state else -1,
        client=client,
        read_committed=field(body, "isolation_level", 0) == 1,
    )
    results = await ctx.replicas.fetch_messages(params, requested)
    throttle_ms = 0 if params.is_from_follower else _consumer_throttle_ms(ctx, results)
    if throttle_ms:  # as Kafka: answered at once, without records, then muted
        results = [dataclasses.replace(r, records=None) for r in results]
    _count_bytes_out(ctx, params, requested, results)
    return make(
        m.FetchResponse,
        throttle_time=datetime.timedelta(milliseconds=throttle_ms),
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(
            make(
                m.FetchableTopicResponse,
                topic=key,
                topic_id=key,
                partitions=tuple(
                    _partition(
                        m,
                        splicer,
                        index,
                        results[slot]
                        if not isinstance(slot, ErrorCode)
                        else FetchResultPartition(slot),
                    )
                    for index, slot in entries
                ),
            )
            for key, entries in layout
        ),
    )


_UNKNOWN = (ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id)


def _consumer_throttle_ms(ctx: BrokerContext, results: list[FetchResultPartition]) -> int:
    """The consumer's fetch quota: the records read count against it; if that puts it over,
    they are not sent, and not counted (Kafka's `unrecordQuotaSensor`)."""
    context = current_request()
    user, client_id = context.principal.name, context.client_id
    size = sum(r.size for r in results)
    throttle_ms = ctx.quotas.fetch.record(user, client_id, size)
    if throttle_ms:
        ctx.quotas.fetch.unrecord(user, client_id, size)
    return throttle_ms


def _refusal(
    ctx: BrokerContext, name: str | None, by_id: bool, as_follower: bool, cluster_action: bool
) -> ErrorCode | None:
    """Why a topic's partitions are not read, None if they are: a topic id not known; no
    READ on the topic (for a follower, no CLUSTER_ACTION on the cluster), asked before the
    topic's existence as Kafka does; a topic not known."""
    known = name is not None and name in ctx.metadata.topics
    if by_id and not known:
        return ErrorCode.unknown_topic_id
    if not (
        cluster_action if as_follower else authorized(ctx, Op.READ, ResourceType.TOPIC, name or "")
    ):
        return ErrorCode.topic_authorization_failed
    return None if known else ErrorCode.unknown_topic_or_partition


def _count_bytes_out(
    ctx: BrokerContext,
    params: FetchParams,
    requested: list[FetchRequestPartition],
    results: list[FetchResultPartition],
) -> None:
    """Every partition's bytes by tier and rack crossing (`served`); a consumer's also in
    BytesOutPerSec and ConsumerBytesOut, which leave followers out, as Kafka's do."""
    broker_rack = ctx.config.broker_rack
    if params.is_from_follower:
        follower = ctx.metadata.brokers.get(params.replica_id)
        reader_rack = follower.rack if follower is not None else None
    else:
        reader_rack = params.client.rack_id if params.client is not None else None
    to = direction(broker_rack, reader_rack)
    locality = _locality(broker_rack, reader_rack or "")
    metrics = ctx.topic_metrics
    for fetched, result in zip(requested, results, strict=True):
        size = result.size
        if not size:
            continue
        tp = fetched.topic_partition
        tier = Tier.REMOTE if isinstance(result.records, memoryview) else Tier.LOCAL
        metrics.served.served(tp.topic, tier, to, size)
        if not params.is_from_follower:
            metrics.bytes_out.labels(tp.topic).inc(size)
            metrics.consumer_bytes_out.labels(tp.topic, str(tp.partition), locality).inc(size)


def _partition(m: Any, splicer: RecordsSplicer, index: int, result: FetchResultPartition) -> Any:
    # As Kafka: a read that failed reports no offsets (an offset out of range: the client
    # asks ListOffsets), but for a follower sent to the remote tier, which starts there;
    # a partition the metadata does not know has an empty list of aborted transactions.
    failed = result.error not in (ErrorCode.none, ErrorCode.offset_moved_to_tiered_storage)
    high_watermark = -1 if failed else result.high_watermark
    # -1: the high watermark (no read, or a remote one).
    lso = high_watermark if failed or result.last_stable_offset < 0 else result.last_stable_offset
    aborted = (
        tuple(
            m.AbortedTransaction(producer_id=t.producer_id, first_offset=t.first_offset)
            for t in result.aborted_txns
        )
        if result.aborted_txns is not None
        else None
    )
    return make(
        m.PartitionData,
        partition_index=index,
        error_code=result.error,
        high_watermark=high_watermark,
        last_stable_offset=lso,
        log_start_offset=-1 if failed else result.log_start_offset,
        aborted_transactions=() if result.error in _UNKNOWN else aborted,
        preferred_read_replica=result.preferred_read_replica,
        records=splicer.placeholder(result.records) if result.records else b"",
        **_diverging_epoch(m, result),
    )


def _diverging_epoch(m: Any, result: FetchResultPartition) -> dict[str, Any]:
    if result.diverging_epoch is None or not hasattr(m, "EpochEndOffset"):
        return {}
    epoch, end_offset = result.diverging_epoch
    return {"diverging_epoch": m.EpochEndOffset(epoch=epoch, end_offset=end_offset)}


def _locality(broker_rack: str | None, client_rack: str) -> str:
    """Whether bytes served to a consumer stayed in its rack (what KIP-392 saves)."""
    if not client_rack or not broker_rack:
        return "unknown"
    return "same-rack" if client_rack == broker_rack else "cross-rack"
