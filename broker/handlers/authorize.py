"""What every handler asks before acting: may the request's principal do this? (Kafka's
`AuthHelper`.) The principal and client address are the request's (`current_request`).

Without an authorizer every answer is yes, at the cost of one attribute test. Each API
checks what Kafka's KafkaApis checks, and answers a refusal with the resource type's
error: TOPIC_AUTHORIZATION_FAILED, GROUP_..., CLUSTER_..., TRANSACTIONAL_ID_....
"""

from __future__ import annotations

from collections.abc import Iterable

from tierbroker.broker.handlers.common import BrokerContext
from tierbroker.broker.network.request_context import current_request
from tierbroker.broker.security.authorizer.acl import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclOperation,
    ResourceType,
)
from tierbroker.protocol.errors import ErrorCode, KafkaError

Op = AclOperation
DENIED = {
    ResourceType.TOPIC: ErrorCode.topic_authorization_failed,
    ResourceType.GROUP: ErrorCode.group_authorization_failed,
    ResourceType.CLUSTER: ErrorCode.cluster_authorization_failed,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
    ResourceType.DELEGATION_TOKEN: ErrorCode.delegation_token_authorization_failed,
}
# The schemas' default of an authorized-operations field: the client did not ask (KIP-430).
OPERATIONS_NOT_REQUESTED = -(2**31)


def authorized(
    ctx: BrokerContext,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
    log_if_denied: bool = True,
) -> bool:
    authorizer = ctx.authorizer
    if authorizer is None:
        return True
    request = current_request()
    return authorizer.authorize(
        request.principal, request.client_address, operation, resource_type, name, log_if_denied
    )


def authorized_cluster(ctx: BrokerContext, operation: AclOperation) -> bool:
    return authorized(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME)


def unauthorized(
    ctx: BrokerContext, operation: AclOperation, resource_type: ResourceType, name: str
) -> ErrorCode | None:
    """The error refusing `operation` on the resource, None if it is allowed."""
    if authorized(ctx, operation, resource_type, name):
        return None
    return DENIED[resource_type]


def unauthorized_cluster(ctx: BrokerContext, operation: AclOperation) -> ErrorCode | None:
    return unauthorized(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME)


def authorized_topics(
    ctx: BrokerContext, operation: AclOperation, names: Iterable[str], log_if_denied: bool = True
) -> set[str]:
    """The topics of `names` on which `operation` is allowed (each asked once)."""
    names = set(names)
    if ctx.authorizer is None:
        return names
    return {n for n in names if authorized(ctx, operation, ResourceType.TOPIC, n, log_if_denied)}


def authorized_operations(ctx: BrokerContext, resource_type: ResourceType, name: str) -> int:
    """KIP-430: the operations the principal may do on the resource as Kafka encodes them, bit
    `code` set for each allowed operation of those the type supports (every one without an
    authorizer); refusals are not logged at INFO, since nothing was refused."""
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if authorized(ctx, operation, resource_type, name, log_if_denied=False):
            bits |= 1 << operation
    return bits


def authorized_cluster_operations(ctx: BrokerContext) -> int:
    """The cluster's authorized operations, or 0 without DESCRIBE on it (as Kafka answers)."""
    if not authorized_cluster(ctx, Op.DESCRIBE):
        return 0
    return authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)


def authorized_by_resource_type(
    ctx: BrokerContext, operation: AclOperation, resource_type: ResourceType
) -> bool:
    """May the principal do `operation` on some resource of the type (Kafka's
    `authorizeByResourceType`)?"""
    authorizer = ctx.authorizer
    if authorizer is None:
        return True
    request = current_request()
    return authorizer.authorize_by_resource_type(
        request.principal, request.client_address, operation, resource_type
    )


def require(
    ctx: BrokerContext, operation: AclOperation, resource_type: ResourceType, name: str
) -> None:
    """Raises KafkaError with the resource type's authorization error unless allowed."""
    if (denied := unauthorized(ctx, operation, resource_type, name)) is not None:
        raise KafkaError(
            denied, f"not authorized to {operation.name} {resource_type.pascal_name} {name!r}"
        )
