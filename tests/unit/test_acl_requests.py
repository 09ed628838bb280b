"""CreateAcls, DescribeAcls and DeleteAcls as Kafka's AclApis answers them: Kafka's
validation of a new ACL (INVALID_REQUEST, the others still created), SECURITY_DISABLED
without an authorizer, and the filters' ANY and MATCH."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.create_acls.v3 import request as create
from kio.schema.describe_acls.v3 import request as describe
from kio.static.primitive import i8

from tierbroker.broker.handlers.acls import handle_create_acls, handle_describe_acls
from tierbroker.broker.metadata.acl_store import AclStore
from tierbroker.broker.metadata.inprocess_store import InProcessZooKeeper
from tierbroker.broker.security.authorizer.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierbroker.broker.security.authorizer.authorizer import Authorizer, AuthorizerConfig
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode


def creation(**changed: Any) -> create.AclCreation:
    fields: dict[str, Any] = {
        "resource_type": i8(2), "resource_name": "orders", "resource_pattern_type": i8(3),
        "principal": "User:alice", "host": "*", "operation": i8(3), "permission_type": i8(3),
    }  # fmt: skip
    fields.update({k: i8(v) if isinstance(v, int) else v for k, v in changed.items()})
    return create.AclCreation(**fields)


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        ({"resource_type": 1}, "Invalid resourceType ANY"),
        ({"resource_type": 0}, "Invalid resourceType UNKNOWN"),
        ({"resource_pattern_type": 2}, "Invalid patternType MATCH"),
        ({"resource_pattern_type": 1}, "Invalid patternType ANY"),
        ({"operation": 1}, "Invalid operation ANY"),
        ({"operation": 99}, "Invalid operation UNKNOWN"),
        ({"permission_type": 1}, "Invalid permissionType ANY"),
        ({"resource_name": ""}, "Resource name should not be empty"),
        ({"resource_type": 4, "resource_name": "c"}, "only valid name for the CLUSTER"),
        ({"principal": "alice"}, "Could not parse principal"),
    ],
)
async def test_kafkas_validation_refuses_one_creation_and_creates_the_others(
    tmp_path: Path, changed: dict[str, Any], reason: str
) -> None:
    server = InProcessZooKeeper(tmp_path / "metadata.db")
    await server.open()
    session = server.session()
    await session.start()
    # Outside a request the principal is User:ANONYMOUS: here the one allowed to alter ACLs.
    authorizer = Authorizer(AuthorizerConfig(frozenset({"User:ANONYMOUS"})))
    store = AclStore(session, authorizer.acls)
    await store.start()
    ctx: Any = SimpleNamespace(authorizer=authorizer, acl_store=store)
    body = create.CreateAclsRequest(creations=(creation(**changed), creation()))
    answer = await handle_create_acls(ctx, Request(30, 3, 1, "test", body), None)
    refused, created = answer.results
    assert refused.error_code == ErrorCode.invalid_request
    assert reason in refused.error_message
    assert created.error_code == ErrorCode.none
    assert len(authorizer.acls) == 1
    await store.close()
    await session.close()
    await server.close()


async def test_without_an_authorizer_the_acl_apis_answer_security_disabled() -> None:
    ctx: Any = SimpleNamespace(authorizer=None, acl_store=None)
    created = await handle_create_acls(
        ctx, Request(30, 3, 1, "t", create.CreateAclsRequest(creations=(creation(),))), None
    )
    assert [r.error_code for r in created.results] == [ErrorCode.security_disabled]
    described = await handle_describe_acls(
        ctx,
        Request(
            29, 3, 1, "t",
            describe.DescribeAclsRequest(
                resource_type_filter=i8(1), resource_name_filter=None,
                pattern_type_filter=i8(1), principal_filter=None, host_filter=None,
                operation=i8(1), permission_type=i8(1),
            ),
        ),
        None,
    )  # fmt: skip
    assert described.error_code == ErrorCode.security_disabled


def binding(name: str, pattern_type: PatternType) -> AclBinding:
    return AclBinding(
        ResourcePattern(ResourceType.TOPIC, name, pattern_type),
        AccessControlEntry("User:a", "*", AclOperation.READ, AclPermissionType.ALLOW),
    )


def selecting(name: str | None, pattern_type: PatternType) -> AclBindingFilter:
    return AclBindingFilter(
        resource_type=ResourceType.TOPIC, name=name, pattern_type=pattern_type,
        principal=None, host=None, operation=AclOperation.ANY,
        permission_type=AclPermissionType.ANY,
    )  # fmt: skip


def test_filters_any_match_and_exact() -> None:
    literal, wildcard = binding("orders-eu", PatternType.LITERAL), binding("*", PatternType.LITERAL)
    prefix, other = binding("orders-", PatternType.PREFIXED), binding("pay", PatternType.PREFIXED)
    every = [literal, wildcard, prefix, other]
    match = selecting("orders-eu", PatternType.MATCH)
    assert [b for b in every if match.matches(b)] == [literal, wildcard, prefix]
    exact = selecting("orders-", PatternType.ANY)
    assert [b for b in every if exact.matches(b)] == [prefix]
    assert [b for b in every if selecting(None, PatternType.ANY).matches(b)] == every
    assert [b for b in every if selecting(None, PatternType.PREFIXED).matches(b)] == [
        prefix, other,
    ]  # fmt: skip
    assert selecting("orders-", PatternType.ANY).exact_patterns() == (
        ResourcePattern(ResourceType.TOPIC, "orders-", PatternType.LITERAL),
        ResourcePattern(ResourceType.TOPIC, "orders-", PatternType.PREFIXED),
    )
    assert match.exact_patterns() == ()


def test_names_parse_as_kafka_writes_them() -> None:
    assert AclOperation.parse("DescribeConfigs") is AclOperation.DESCRIBE_CONFIGS
    assert AclOperation.parse("describe_configs") is AclOperation.DESCRIBE_CONFIGS
    assert ResourceType.parse("TransactionalId") is ResourceType.TRANSACTIONAL_ID
    assert ResourceType.TRANSACTIONAL_ID.pascal_name == "TransactionalId"
    with pytest.raises(ValueError, match="not a AclOperation"):
        AclOperation.parse("Fly")
