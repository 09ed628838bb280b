"""AlterPartitionReassignments and ListPartitionReassignments: an operator moves
partitions to other replicas, or cancels a move, and lists the moves in progress.

As in Kafka's ZooKeeper mode, the controller decides and answers; any other broker
answers NOT_CONTROLLER for the whole request (admin clients send it to the controller).
An accepted move is answered at once: the new replicas catch up afterwards, which
ListPartitionReassignments shows. With an authorizer, moving needs ALTER on the cluster
and listing DESCRIBE (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import Any

from tierbroker.broker.controller.controller import NotController
from tierbroker.broker.handlers.authorize import Op, unauthorized_cluster
from tierbroker.broker.handlers.common import NO_THROTTLE, BrokerContext, make, response_module
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition


async def handle_alter_partition_reassignments(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    m = response_module(request.api_key, request.api_version)
    targets = {
        TopicPartition(t.name, p.partition_index): (
            None if p.replicas is None else [int(b) for b in p.replicas]
        )
        for t in request.body.topics
        for p in t.partitions
    }
    if denied := unauthorized_cluster(ctx, Op.ALTER):
        return _refused(m.AlterPartitionReassignmentsResponse, denied, responses=())
    try:
        outcomes = await ctx.controller.alter_reassignments(targets)
    except NotController:
        return _not_controller(m.AlterPartitionReassignmentsResponse, responses=())
    by_topic: dict[str, list[Any]] = {}
    for tp, rejection in outcomes.items():
        by_topic.setdefault(tp.topic, []).append(
            m.ReassignablePartitionResponse(
                partition_index=tp.partition,
                error_code=ErrorCode.none if rejection is None else rejection.error,
                error_message=None if rejection is None else rejection.message,
            )
        )
    return make(
        m.AlterPartitionReassignmentsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        responses=tuple(
            m.ReassignableTopicResponse(name=topic, partitions=tuple(partitions))
            for topic, partitions in by_topic.items()
        ),
    )


async def handle_list_partition_reassignments(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    m = response_module(request.api_key, request.api_version)
    topics = request.body.topics
    wanted = (
        None
        if topics is None
        else [TopicPartition(t.name, p) for t in topics for p in t.partition_indexes]
    )
    if denied := unauthorized_cluster(ctx, Op.DESCRIBE):
        return _refused(m.ListPartitionReassignmentsResponse, denied, topics=())
    try:
        moves = ctx.controller.list_reassignments(wanted)
    except NotController:
        return _not_controller(m.ListPartitionReassignmentsResponse, topics=())
    by_topic: dict[str, list[Any]] = {}
    for tp, move in sorted(moves.items()):
        by_topic.setdefault(tp.topic, []).append(
            m.OngoingPartitionReassignment(
                partition_index=tp.partition,
                replicas=move.replicas,
                adding_replicas=move.adding,
                removing_replicas=move.removing,
            )
        )
    return make(
        m.ListPartitionReassignmentsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        topics=tuple(
            m.OngoingTopicReassignment(name=topic, partitions=tuple(partitions))
            for topic, partitions in by_topic.items()
        ),
    )


def _not_controller(response: type, **empty: Any) -> Any:
    return _refused(response, ErrorCode.not_controller, **empty)


def _refused(response: type, error: ErrorCode, **empty: Any) -> Any:
    messages = {
        ErrorCode.not_controller: "this broker is not the controller",
        ErrorCode.cluster_authorization_failed: "ALTER or DESCRIBE on the cluster is needed",
    }
    return make(
        response,
        throttle_time=NO_THROTTLE,
        error_code=error,
        error_message=messages.get(error),
        **empty,
    )
