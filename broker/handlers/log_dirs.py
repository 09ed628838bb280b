"""Log administration: DeleteRecords (moves the log start offset) and DescribeLogDirs.

With an authorizer, DeleteRecords needs DELETE on the topic (TOPIC_AUTHORIZATION_FAILED)
and DescribeLogDirs DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED, no dirs).
"""

from __future__ import annotations

import shutil
from typing import Any

from tierbroker.broker.handlers.authorize import Op, require, unauthorized_cluster
from tierbroker.broker.handlers.common import NO_THROTTLE, BrokerContext, make, response_module
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition


async def handle_delete_records(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for p in topic.partitions:
            try:
                require(ctx, Op.DELETE, ResourceType.TOPIC, topic.name)
                low = ctx.replicas.delete_records(
                    TopicPartition(topic.name, p.partition_index), p.offset
                )
                error = ErrorCode.none
            except KafkaError as e:
                low, error = -1, e.code
            partitions.append(
                make(
                    m.DeleteRecordsPartitionResult,
                    partition_index=p.partition_index,
                    low_watermark=low,
                    error_code=error,
                )
            )
        topics.append(
            make(m.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(partitions))
        )
    return make(m.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def handle_describe_log_dirs(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    if denied := unauthorized_cluster(ctx, Op.DESCRIBE):
        return make(
            m.DescribeLogDirsResponse, throttle_time=NO_THROTTLE, error_code=denied, results=()
        )
    wanted = None
    if request.body.topics is not None:
        wanted = {TopicPartition(t.topic, p) for t in request.body.topics for p in t.partitions}
    results = []
    for log_dir in ctx.replicas.log_manager.log_dirs:
        by_topic: dict[str, list[Any]] = {}
        for tp, lg in sorted(ctx.replicas.log_manager.logs.items()):
            if lg.dir.parent != log_dir or (wanted is not None and tp not in wanted):
                continue
            by_topic.setdefault(tp.topic, []).append(
                make(
                    m.DescribeLogDirsPartition,
                    partition_index=tp.partition,
                    partition_size=lg.size_in_bytes,
                    offset_lag=0,
                    is_future_key=False,
                )
            )
        usage = shutil.disk_usage(log_dir)
        results.append(
            make(
                m.DescribeLogDirsResult,
                error_code=ErrorCode.none,
                log_dir=str(log_dir.resolve()),
                topics=tuple(
                    make(m.DescribeLogDirsTopic, name=n, partitions=tuple(ps))
                    for n, ps in by_topic.items()
                ),
                total_bytes=usage.total,
                usable_bytes=usage.free,
                is_cordoned=False,
            )
        )
    return make(
        m.DescribeLogDirsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        results=tuple(results),
    )
