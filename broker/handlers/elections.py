"""ElectLeaders: an operator moves leadership to preferred replicas, or elects a leader
for leaderless partitions uncleanly, through the controller.

As in Kafka's ZooKeeper mode, the controller decides; any other broker answers
NOT_CONTROLLER per partition (admin clients send the request to the controller). The
answer waits, up to the request's timeout, until this broker's metadata shows the new
leaders, as Kafka's DelayedElectLeader does. With an authorizer it needs ALTER on the
cluster (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import Any

from tierbroker.broker.controller.controller import NotController
from tierbroker.broker.controller.leader_election import Election, ElectionType
from tierbroker.broker.handlers.authorize import Op, unauthorized_cluster
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition


async def handle_elect_leaders(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    wanted = (
        None
        if body.topic_partitions is None
        else [TopicPartition(t.topic, p) for t in body.topic_partitions for p in t.partitions]
    )
    if denied := unauthorized_cluster(ctx, Op.ALTER):
        return _answer(m, wanted or [], Election(denied), denied)
    try:
        election_type = ElectionType(field(body, "election_type", ElectionType.PREFERRED))
    except ValueError:
        return _answer(m, wanted or [], Election(ErrorCode.invalid_request, message="bad type"))
    try:
        outcomes = await ctx.controller.elect_leaders(election_type, wanted)
    except NotController:
        return _answer(m, wanted or [], Election(ErrorCode.not_controller))
    if wanted is None:  # every partition: Kafka leaves out those that needed no election
        outcomes = {tp: e for tp, e in outcomes.items() if e.error != ErrorCode.election_not_needed}
    elected = {tp: e.state.leader for tp, e in outcomes.items() if e.state is not None}
    cache = ctx.metadata
    shown = await cache.wait_until(
        lambda: all(
            (s := cache.states.get(tp)) is not None and s.leader == leader
            for tp, leader in elected.items()
        ),
        body.timeout.total_seconds(),
    )
    if not shown:
        outcomes = {
            tp: Election(ErrorCode.request_timed_out, message="the election is not done yet")
            if tp in elected and cache.states[tp].leader != elected[tp]
            else e
            for tp, e in outcomes.items()
        }
    return _response(m, outcomes)


def _answer(
    m: Any,
    partitions: list[TopicPartition],
    election: Election,
    error: ErrorCode = ErrorCode.none,
) -> Any:
    return _response(m, dict.fromkeys(partitions, election), error)


def _response(
    m: Any, outcomes: dict[TopicPartition, Election], error: ErrorCode = ErrorCode.none
) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for tp, e in sorted(outcomes.items()):
        result = m.PartitionResult(
            partition_id=tp.partition, error_code=e.error, error_message=e.message
        )
        by_topic.setdefault(tp.topic, []).append(result)
    return make(
        m.ElectLeadersResponse,
        throttle_time=NO_THROTTLE,
        error_code=error,
        replica_election_results=tuple(
            m.ReplicaElectionResult(topic=topic, partition_result=tuple(results))
            for topic, results in by_topic.items()
        ),
    )
