"""Committed offsets: OffsetCommit, OffsetFetch (single and multi-group) and OffsetDelete.

From OffsetCommit v10 and OffsetFetch v10 topics are named by id. With an authorizer,
OffsetCommit needs READ on the group, then on each topic; OffsetFetch DESCRIBE on the
group and the topics (an unauthorized topic is left out of a fetch of all of them);
OffsetDelete DELETE on the group and READ on the topics. Refusals are
GROUP_AUTHORIZATION_FAILED, and TOPIC_AUTHORIZATION_FAILED per partition.
"""

from __future__ import annotations

from typing import Any

from tierbroker.broker.coordinator.group.records import OffsetValue
from tierbroker.broker.handlers.authorize import Op, authorized_topics, unauthorized
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.log import now_ms
from tierbroker.storage.topic_partition import TopicPartition


def _topic_name(ctx: BrokerContext, topic: Any) -> str:
    """The name of a request topic given by name or (newer versions) by id; '' if unknown."""
    name = field(topic, "name")
    if name is not None:
        return str(name)
    return ctx.metadata.topic_by_id(topic.topic_id) or ""


async def handle_offset_commit(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    timestamp = now_ms()
    offsets: dict[TopicPartition, OffsetValue] = {}
    layout = []
    for topic in body.topics:
        name = _topic_name(ctx, topic)
        layout.append((topic, name))
        for p in topic.partitions:
            offsets[TopicPartition(name, p.partition_index)] = OffsetValue(
                p.committed_offset,
                field(p, "committed_leader_epoch", -1),
                p.committed_metadata or "",
                timestamp,
            )
    results: dict[TopicPartition, ErrorCode]
    if denied := unauthorized(ctx, Op.READ, ResourceType.GROUP, body.group_id):
        results = dict.fromkeys(offsets, denied)
    else:
        readable = authorized_topics(ctx, Op.READ, {tp.topic for tp in offsets})
        results = {
            tp: ErrorCode.topic_authorization_failed for tp in offsets if tp.topic not in readable
        }
        results.update(
            await ctx.groups.offsets.commit(
                body.group_id,
                body.member_id,
                field(body, "group_instance_id"),
                body.generation_id_or_member_epoch,
                {tp: v for tp, v in offsets.items() if tp not in results},
            )
        )
    return make(
        m.OffsetCommitResponse,
        throttle_time=NO_THROTTLE,
        topics=tuple(
            make(
                m.OffsetCommitResponseTopic,
                name=name,
                topic_id=field(topic, "topic_id"),
                partitions=tuple(
                    make(
                        m.OffsetCommitResponsePartition,
                        partition_index=p.partition_index,
                        error_code=results[TopicPartition(name, p.partition_index)],
                    )
                    for p in topic.partitions
                ),
            )
            for topic, name in layout
        ),
    )


def _fetch_group(
    ctx: BrokerContext, m: Any, group_id: str, topics: Any, by_id: bool, require_stable: bool
) -> tuple[Any, ...]:
    """The group's committed offsets; with `require_stable` (v7+), a partition an open
    transaction commits an offset of is UNSTABLE_OFFSET_COMMIT, which clients retry."""
    denied: set[str] = set()  # topics the principal may not describe
    if topics is None:
        committed = ctx.groups.store.fetch(group_id, None)
        visible = authorized_topics(ctx, Op.DESCRIBE, {tp.topic for tp in committed}, False)
        by_topic: dict[str, list[tuple[int, OffsetValue | None]]] = {}
        for tp, value in sorted(committed.items()):
            if tp.topic in visible:
                by_topic.setdefault(tp.topic, []).append((tp.partition, value))
        wanted: list[tuple[Any, str, list[tuple[int, OffsetValue | None]]]] = [
            (name, name, parts) for name, parts in by_topic.items()
        ]
    else:
        wanted = []
        names = [_topic_name(ctx, topic) for topic in topics]
        denied = set(names) - authorized_topics(ctx, Op.DESCRIBE, names)
        for topic in topics:
            name = _topic_name(ctx, topic)
            found = ctx.groups.store.fetch(
                group_id, [TopicPartition(name, i) for i in topic.partition_indexes]
            )
            key = field(topic, "topic_id") if by_id else name
            wanted.append((key, name, [(tp.partition, v) for tp, v in found.items()]))
    store = ctx.groups.store

    def unstable(topic: str, partition: int) -> bool:
        return require_stable and store.has_pending(group_id, TopicPartition(topic, partition))

    result = []
    for key, name, parts in wanted:
        # Only the versions that name topics by id (v10+) have the field.
        identity = {"topic_id": key} if by_id else {}
        result.append(
            make(
                m.OffsetFetchResponseTopics
                if hasattr(m, "OffsetFetchResponseTopics")
                else m.OffsetFetchResponseTopic,
                name=name,
                **identity,
                partitions=tuple(
                    make(
                        m.OffsetFetchResponsePartitions
                        if hasattr(m, "OffsetFetchResponsePartitions")
                        else m.OffsetFetchResponsePartition,
                        partition_index=index,
                        committed_offset=-1 if hidden or not v else v.offset,
                        committed_leader_epoch=-1 if hidden or not v else v.leader_epoch,
                        metadata=v.metadata if v and not hidden else "",
                        error_code=ErrorCode.topic_authorization_failed
                        if name in denied
                        else ErrorCode.unstable_offset_commit
                        if hidden
                        else ErrorCode.none,
                    )
                    for index, v in parts
                    for hidden in (name in denied or unstable(name, index),)
                ),
            )
        )
    return tuple(result)


def _group_error(ctx: BrokerContext, group_id: str) -> ErrorCode:
    """Why the group's offsets are not fetched here: no DESCRIBE on it, or not its
    coordinator (ErrorCode.none: they are)."""
    denied = unauthorized(ctx, Op.DESCRIBE, ResourceType.GROUP, group_id)
    return denied or ctx.groups.coordinator_error(group_id)


async def handle_offset_fetch(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    by_id = request.api_version >= 10
    require_stable = bool(field(body, "require_stable", False))
    if request.api_version >= 8:
        groups = []
        for g in body.groups:
            error = _group_error(ctx, g.group_id)
            groups.append(
                make(
                    m.OffsetFetchResponseGroup,
                    group_id=g.group_id,
                    error_code=error,
                    topics=_fetch_group(ctx, m, g.group_id, g.topics, by_id, require_stable)
                    if error == ErrorCode.none
                    else (),
                )
            )
        return make(m.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple(groups))
    error = _group_error(ctx, body.group_id)
    return make(
        m.OffsetFetchResponse,
        throttle_time=NO_THROTTLE,
        error_code=error,
        topics=_fetch_group(ctx, m, body.group_id, body.topics, False, require_stable)
        if error == ErrorCode.none
        else (),
    )


async def handle_offset_delete(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    partitions = [
        TopicPartition(t.name, p.partition_index) for t in body.topics for p in t.partitions
    ]
    results: dict[TopicPartition, ErrorCode] = {}
    if denied := unauthorized(ctx, Op.DELETE, ResourceType.GROUP, body.group_id):
        error = denied
    else:
        readable = authorized_topics(ctx, Op.READ, {tp.topic for tp in partitions})
        refused = {
            tp: ErrorCode.topic_authorization_failed
            for tp in partitions
            if tp.topic not in readable
        }
        error, results = await ctx.groups.offsets.delete(
            body.group_id, [tp for tp in partitions if tp not in refused]
        )
        results = {**results, **refused}
    return make(
        m.OffsetDeleteResponse,
        error_code=error,
        throttle_time=NO_THROTTLE,
        topics=tuple(
            make(
                m.OffsetDeleteResponseTopic,
                name=t.name,
                partitions=tuple(
                    make(
                        m.OffsetDeleteResponsePartition,
                        partition_index=p.partition_index,
                        error_code=results.get(TopicPartition(t.name, p.partition_index), error),
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        ),
    )
