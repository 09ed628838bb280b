"""KIP-430's authorized operations as Kafka's `AuthHelper.authorizedOperations` encodes them:
bit `code` set for each allowed operation the resource type supports, every one of them
without an authorizer, and 0 for the cluster without DESCRIBE on it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tierbroker.broker.handlers.authorize import (
    authorized_cluster_operations,
    authorized_operations,
)
from tierbroker.broker.security.authorizer.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierbroker.broker.security.authorizer.authorizer import Authorizer, AuthorizerConfig

Op = AclOperation


def context(*grants: tuple[ResourceType, str, AclOperation, AclPermissionType]) -> Any:
    """A handler context whose authorizer holds `grants` for User:ANONYMOUS (the principal
    outside a request)."""
    authorizer = Authorizer(AuthorizerConfig(frozenset()))
    for resource_type, name, operation, permission in grants:
        pattern = ResourcePattern(resource_type, name, PatternType.LITERAL)
        entry = AccessControlEntry("User:ANONYMOUS", "*", operation, permission)
        authorizer.acls.replace(pattern, authorizer.acls.get(pattern) | {entry})
    return SimpleNamespace(authorizer=authorizer)


def allow(resource_type: ResourceType, name: str, operation: AclOperation) -> Any:
    return (resource_type, name, operation, AclPermissionType.ALLOW)


def test_each_allowed_operation_is_its_codes_bit() -> None:
    ctx = context(
        allow(ResourceType.TOPIC, "orders", Op.READ), allow(ResourceType.TOPIC, "orders", Op.WRITE)
    )
    # READ (3), WRITE (4) and the DESCRIBE (8) they imply.
    assert authorized_operations(ctx, ResourceType.TOPIC, "orders") == 0b1_0001_1000
    assert authorized_operations(ctx, ResourceType.TOPIC, "payments") == 0


def test_all_is_every_supported_operation_less_the_denied_ones() -> None:
    denied = (ResourceType.GROUP, "g", Op.DELETE, AclPermissionType.DENY)
    ctx = context(allow(ResourceType.GROUP, "g", Op.ALL), denied)
    # READ, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS: no WRITE, no CREATE on a group.
    expected = 1 << 3 | 1 << 8 | 1 << 10 | 1 << 11
    assert authorized_operations(ctx, ResourceType.GROUP, "g") == expected


def test_the_cluster_is_told_only_to_who_may_describe_it() -> None:
    alter_configs = allow(ResourceType.CLUSTER, CLUSTER_NAME, Op.ALTER_CONFIGS)
    assert authorized_cluster_operations(context(alter_configs)) == 0
    describe = allow(ResourceType.CLUSTER, CLUSTER_NAME, Op.DESCRIBE)
    expected = 1 << 8 | 1 << 10 | 1 << 11  # DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS
    assert authorized_cluster_operations(context(alter_configs, describe)) == expected


def test_without_an_authorizer_every_supported_operation() -> None:
    ctx = SimpleNamespace(authorizer=None)
    # CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE
    expected = sum(1 << code for code in (5, 9, 10, 11, 12, 7, 8))
    assert authorized_cluster_operations(ctx) == expected
    assert authorized_operations(ctx, ResourceType.TRANSACTIONAL_ID, "t") == 1 << 8 | 1 << 4
