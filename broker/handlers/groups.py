"""Consumer-group membership: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
DescribeGroups, ListGroups and DeleteGroups.

With an authorizer: membership needs READ on the group, FindCoordinator and DescribeGroups
DESCRIBE (on the transactional id for a transaction's coordinator), DeleteGroups DELETE;
ListGroups lists every group with DESCRIBE on the cluster, else those the principal may
describe. A refusal is GROUP_AUTHORIZATION_FAILED (TRANSACTIONAL_ID_... for a txn id).
DescribeGroups v3+ answers, when asked (KIP-430), what the principal may do on each group."""

from __future__ import annotations

import logging
from typing import Any

from tierbroker.broker.coordinator.group.coordinator import JoinRequest
from tierbroker.broker.coordinator.group.group import JoinResult
from tierbroker.broker.coordinator.group.offsets_store import OFFSETS_TOPIC
from tierbroker.broker.coordinator.transaction.state_manager import TRANSACTION_STATE_TOPIC
from tierbroker.broker.handlers.authorize import (
    OPERATIONS_NOT_REQUESTED,
    Op,
    authorized,
    authorized_cluster,
    authorized_operations,
    unauthorized,
)
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    client_endpoint,
    field,
    make,
    response_module,
)
from tierbroker.broker.network.request_context import current_request
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
_KEY_RESOURCE = {
    GROUP_KEY_TYPE: ResourceType.GROUP,
    TRANSACTION_KEY_TYPE: ResourceType.TRANSACTIONAL_ID,
}


async def handle_find_coordinator(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    """A group's coordinator is the leader of its `__consumer_offsets` partition, a
    transactional id's the leader of its `__transaction_state` partition (each topic
    created on first use, as Kafka does)."""
    m = response_module(request.api_key, request.api_version)
    body = request.body
    key_type = field(body, "key_type", GROUP_KEY_TYPE)
    keys = body.coordinator_keys if request.api_version >= 4 else (body.key,)
    answers = [await _coordinator(ctx, key_type, key) for key in keys]
    if request.api_version >= 4:
        return make(
            m.FindCoordinatorResponse,
            throttle_time=NO_THROTTLE,
            coordinators=tuple(
                make(
                    m.Coordinator,
                    key=key,
                    node_id=node,
                    host=host,
                    port=port,
                    error_code=error,
                    error_message=None,
                )
                for key, (error, node, host, port) in zip(keys, answers, strict=True)
            ),
        )
    error, node, host, port = answers[0]
    return make(
        m.FindCoordinatorResponse,
        throttle_time=NO_THROTTLE,
        error_code=error,
        error_message=None,
        node_id=node,
        host=host,
        port=port,
    )


async def _coordinator(
    ctx: BrokerContext, key_type: int, key: str
) -> tuple[ErrorCode, int, str, int]:
    """(error, node id, host, port) of the coordinator of `key`, which needs DESCRIBE on
    the group or transactional id."""
    resource_type = _KEY_RESOURCE.get(key_type)
    if resource_type is not None and (denied := unauthorized(ctx, Op.DESCRIBE, resource_type, key)):
        return denied, -1, "", -1
    try:
        if key_type == GROUP_KEY_TYPE:
            await ctx.groups.store.ensure_topic()
            tp = TopicPartition(OFFSETS_TOPIC, ctx.groups.store.partition_of(key))
            hosted = ctx.groups.hosts(tp.partition)
        elif key_type == TRANSACTION_KEY_TYPE:
            state = ctx.transactions.state
            await state.ensure_topic()
            tp = TopicPartition(TRANSACTION_STATE_TOPIC, state.partition_of(key))
            hosted = state.hosts(tp.partition)
        else:
            return ErrorCode.invalid_request, -1, "", -1
    except KafkaError as e:
        log.info("FindCoordinator for %r: %s", key, e)
        return ErrorCode.coordinator_not_available, -1, "", -1
    leader = ctx.metadata.leader_endpoint(tp)
    # Led here by the metadata but not yet by the replica manager: its state is not loading
    # yet, and this broker would answer the key's requests NOT_COORDINATOR.
    if leader is None or (leader.broker_id == ctx.config.broker_id and not hosted):
        return ErrorCode.coordinator_not_available, -1, "", -1
    endpoint = client_endpoint(leader)
    if endpoint is None:  # not reachable on the client's listener
        return ErrorCode.coordinator_not_available, -1, "", -1
    return ErrorCode.none, leader.broker_id, endpoint.host, endpoint.port


async def handle_join_group(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    session_timeout_ms = int(body.session_timeout.total_seconds() * 1000)
    rebalance = field(body, "rebalance_timeout")
    if denied := unauthorized(ctx, Op.READ, ResourceType.GROUP, body.group_id):
        result = JoinResult(denied, member_id=body.member_id)
    else:
        result = await ctx.groups.join_group(
            JoinRequest(
                group_id=body.group_id,
                member_id=body.member_id,
                group_instance_id=field(body, "group_instance_id"),
                client_id=request.client_id or "",
                client_host=current_request().client_host,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=int(rebalance.total_seconds() * 1000)
                if rebalance
                else session_timeout_ms,
                protocol_type=body.protocol_type,
                protocols=[(p.name, p.metadata) for p in body.protocols],
                require_known_member_id=request.api_version >= 4,
                supports_skip_assignment=request.api_version >= 9,
            )
        )
    return make(
        m.JoinGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name
        if request.api_version >= 7
        else (result.protocol_name or ""),
        leader=result.leader_id,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=tuple(
            make(m.JoinGroupResponseMember, member_id=mid, group_instance_id=iid, metadata=meta)
            for mid, iid, meta in result.members
        ),
    )


async def handle_sync_group(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    if denied := unauthorized(ctx, Op.READ, ResourceType.GROUP, body.group_id):
        return make(
            m.SyncGroupResponse,
            throttle_time=NO_THROTTLE,
            error_code=denied,
            protocol_type=None,
            protocol_name=None,
            assignment=b"",
        )
    result = await ctx.groups.sync_group(
        body.group_id,
        body.generation_id,
        body.member_id,
        field(body, "group_instance_id"),
        field(body, "protocol_type"),
        field(body, "protocol_name"),
        {a.member_id: a.assignment for a in body.assignments},
    )
    return make(
        m.SyncGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def handle_heartbeat(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    error = unauthorized(ctx, Op.READ, ResourceType.GROUP, body.group_id) or ctx.groups.heartbeat(
        body.group_id, body.member_id, field(body, "group_instance_id"), body.generation_id
    )
    return make(m.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error)


async def handle_leave_group(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    if request.api_version >= 3:
        leaving = [(mi.member_id, mi.group_instance_id) for mi in body.members]
    else:
        leaving = [(body.member_id, None)]
    results: list[tuple[str, str | None, ErrorCode]] = []
    if denied := unauthorized(ctx, Op.READ, ResourceType.GROUP, body.group_id):
        error = denied
    else:
        error, results = ctx.groups.leave_group(body.group_id, leaving)
    if request.api_version < 3:
        return make(
            m.LeaveGroupResponse,
            throttle_time=NO_THROTTLE,
            error_code=results[0][2] if results else error,
        )
    return make(
        m.LeaveGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=error,
        members=tuple(
            make(m.MemberResponse, member_id=mid, group_instance_id=iid, error_code=e)
            for mid, iid, e in results
        ),
    )


async def handle_describe_groups(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    operations = field(request.body, "include_authorized_operations", False)
    described = []
    for group_id in request.body.groups:
        group = ctx.groups.groups.get(group_id)
        coordinator_error = unauthorized(
            ctx, Op.DESCRIBE, ResourceType.GROUP, group_id
        ) or ctx.groups.coordinator_error(group_id)
        if group is None or coordinator_error != ErrorCode.none:
            error = coordinator_error
            if error == ErrorCode.none:
                error = ErrorCode.group_id_not_found if request.api_version >= 6 else ErrorCode.none
            described.append(
                make(
                    m.DescribedGroup,
                    error_code=error,
                    error_message=None,
                    group_id=group_id,
                    group_state="Dead",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                )
            )
            continue
        described.append(
            make(
                m.DescribedGroup,
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=group.state.value,
                protocol_type=group.protocol_type or "",
                protocol_data=group.protocol_name or "",
                members=tuple(
                    make(m.DescribedGroupMember, **member) for member in group.describe_members()
                ),
                authorized_operations=(
                    authorized_operations(ctx, ResourceType.GROUP, group_id)
                    if operations
                    else OPERATIONS_NOT_REQUESTED
                ),
            )
        )
    return make(m.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(described))


async def handle_list_groups(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    states = {s.lower() for s in field(request.body, "states_filter", ()) or ()}
    types = {t.lower() for t in field(request.body, "types_filter", ()) or ()}
    # Every group with DESCRIBE on the cluster, else those the principal may describe.
    every = authorized_cluster(ctx, Op.DESCRIBE)
    listed = [
        make(
            m.ListedGroup,
            group_id=g.group_id,
            protocol_type=g.protocol_type or "",
            group_state=g.state.value,
            group_type="classic",
        )
        for g in ctx.groups.groups.values()
        if (not states or g.state.value.lower() in states)
        and (not types or "classic" in types)
        and (every or authorized(ctx, Op.DESCRIBE, ResourceType.GROUP, g.group_id, False))
    ]
    return make(
        m.ListGroupsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        groups=tuple(listed),
    )


async def handle_delete_groups(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    names = list(request.body.groups_names)
    refused = {g: e for g in names if (e := unauthorized(ctx, Op.DELETE, ResourceType.GROUP, g))}
    results = await ctx.groups.offsets.delete_groups([g for g in names if g not in refused])
    results.update(refused)
    return make(
        m.DeleteGroupsResponse,
        throttle_time=NO_THROTTLE,
        results=tuple(
            make(m.DeletableGroupResult, group_id=g, error_code=e) for g, e in results.items()
        ),
    )
