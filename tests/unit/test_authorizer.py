"""The authorizer's decision, as Kafka's StandardAuthorizer makes it: super users, DENY
before ALLOW, the implied operations, literal, wildcard and prefixed patterns, principals
and hosts, `allow.everyone.if.no.acl.found`; and the configuration that enables it."""

from __future__ import annotations

import pytest

from tierbroker.broker.security.authorizer.acl import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierbroker.broker.security.authorizer.authorizer import Authorizer, AuthorizerConfig
from tierbroker.broker.security.principal import KafkaPrincipal

Op = AclOperation
ALICE = KafkaPrincipal("User", "alice")
BOB = KafkaPrincipal("User", "bob")
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
HOST = "10.0.0.1"


def authorizer(allow_everyone: bool = False, super_users: str = "") -> Authorizer:
    config = AuthorizerConfig.from_properties(
        {
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": super_users,
            "allow.everyone.if.no.acl.found": str(allow_everyone).lower(),
        }
    )
    assert config is not None
    return Authorizer(config)


def add(
    auth: Authorizer,
    name: str,
    op: AclOperation,
    permission: AclPermissionType = ALLOW,
    principal: str = "User:alice",
    host: str = "*",
    pattern_type: PatternType = PatternType.LITERAL,
    resource_type: ResourceType = TOPIC,
) -> None:
    pattern = ResourcePattern(resource_type, name, pattern_type)
    entry = AccessControlEntry(principal, host, op, permission)
    auth.acls.replace(pattern, auth.acls.get(pattern) | {entry})


def may(
    auth: Authorizer,
    op: AclOperation,
    name: str = "orders",
    who: KafkaPrincipal = ALICE,
    host: str = HOST,
    resource_type: ResourceType = TOPIC,
) -> bool:
    return auth.authorize(who, host, op, resource_type, name)


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.DESCRIBE])
def test_read_write_delete_alter_imply_describe(granted: AclOperation) -> None:
    auth = authorizer()
    add(auth, "orders", granted)
    assert may(auth, Op.DESCRIBE)
    assert may(auth, granted)


@pytest.mark.parametrize(
    "granted",
    [Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE],
)
def test_other_operations_do_not_imply_describe(granted: AclOperation) -> None:
    auth = authorizer()
    add(auth, "orders", granted)
    assert not may(auth, Op.DESCRIBE)


def test_alter_configs_implies_describe_configs_and_nothing_implies_more() -> None:
    auth = authorizer()
    add(auth, "orders", Op.ALTER_CONFIGS)
    assert may(auth, Op.DESCRIBE_CONFIGS)
    assert not may(auth, Op.ALTER)
    add(auth, "cfg", Op.DESCRIBE_CONFIGS)
    assert not may(auth, Op.ALTER_CONFIGS, "cfg")
    add(auth, "reads", Op.READ)
    assert not may(auth, Op.WRITE, "reads")
    assert not may(auth, Op.DESCRIBE_CONFIGS, "reads")


def test_all_allows_every_operation() -> None:
    auth = authorizer()
    add(auth, "orders", Op.ALL)
    assert all(may(auth, op) for op in Op if op.value > 2)


def test_deny_wins_over_allow_and_denies_only_its_operation() -> None:
    auth = authorizer()
    add(auth, "orders", Op.ALL)
    add(auth, "orders", Op.READ, DENY)
    assert not may(auth, Op.READ)
    assert may(auth, Op.WRITE)
    assert may(auth, Op.DESCRIBE)  # a DENY of READ does not deny DESCRIBE


def test_deny_all_denies_everything_even_through_a_wildcard() -> None:
    auth = authorizer()
    add(auth, "orders", Op.READ)
    add(auth, "*", Op.ALL, DENY, principal="User:*")
    assert not may(auth, Op.READ)
    assert not may(auth, Op.DESCRIBE)


def test_wildcard_name_matches_every_resource_of_its_type_only() -> None:
    auth = authorizer()
    add(auth, "*", Op.READ)
    assert may(auth, Op.READ, "anything")
    assert not may(auth, Op.READ, "anything", resource_type=GROUP)


def test_prefixed_pattern_matches_names_starting_with_it() -> None:
    auth = authorizer()
    add(auth, "orders-", Op.WRITE, pattern_type=PatternType.PREFIXED)
    add(auth, "o", Op.READ, pattern_type=PatternType.PREFIXED)
    assert may(auth, Op.WRITE, "orders-eu")
    assert may(auth, Op.WRITE, "orders-")
    assert not may(auth, Op.WRITE, "orders")
    assert not may(auth, Op.WRITE, "payments-eu")
    assert may(auth, Op.READ, "orders-eu")  # two prefixes of different lengths
    add(auth, "orders-eu", Op.WRITE, DENY, pattern_type=PatternType.PREFIXED)
    assert not may(auth, Op.WRITE, "orders-eu-1")
    assert may(auth, Op.WRITE, "orders-us")


def test_a_literal_name_is_not_a_prefix() -> None:
    auth = authorizer()
    add(auth, "orders", Op.READ)
    assert not may(auth, Op.READ, "orders-eu")


def test_principal_and_wildcard_principal() -> None:
    auth = authorizer()
    add(auth, "orders", Op.READ)
    assert not may(auth, Op.READ, who=BOB)
    add(auth, "orders", Op.WRITE, principal="User:*")
    assert may(auth, Op.WRITE, who=BOB)
    assert may(auth, Op.WRITE, who=KafkaPrincipal("Group", "bob"))  # as Kafka: any principal


def test_hosts_match_exactly_or_by_wildcard() -> None:
    auth = authorizer()
    add(auth, "orders", Op.READ, host="10.0.0.2")
    assert not may(auth, Op.READ, host="10.0.0.1")
    assert may(auth, Op.READ, host="10.0.0.2")
    add(auth, "orders", Op.READ, DENY, host="10.0.0.2")
    assert not may(auth, Op.READ, host="10.0.0.2")


def test_super_users_may_do_anything() -> None:
    auth = authorizer(super_users="User:admin; User:CN=broker,O=Example")
    add(auth, "orders", Op.ALL, DENY, principal="User:*")
    assert may(auth, Op.WRITE, who=KafkaPrincipal("User", "admin"))
    assert may(
        auth,
        Op.CLUSTER_ACTION,
        "kafka-cluster",
        KafkaPrincipal("User", "CN=broker,O=Example"),
        resource_type=ResourceType.CLUSTER,
    )
    assert not may(auth, Op.WRITE)


@pytest.mark.parametrize("allow_everyone", [True, False])
def test_allow_everyone_decides_only_where_no_acl_exists(allow_everyone: bool) -> None:
    auth = authorizer(allow_everyone=allow_everyone)
    assert may(auth, Op.READ, "unguarded") is allow_everyone
    add(auth, "guarded", Op.READ, principal="User:bob")
    assert not may(auth, Op.READ, "guarded")  # ACLs exist, none for alice
    add(auth, "guarded-", Op.READ, principal="User:bob", pattern_type=PatternType.PREFIXED)
    assert not may(auth, Op.READ, "guarded-1")


def test_removing_a_patterns_acls_forgets_it() -> None:
    auth = authorizer(allow_everyone=True)
    add(auth, "o", Op.READ, principal="User:bob", pattern_type=PatternType.PREFIXED)
    assert not may(auth, Op.READ, "orders")
    auth.acls.replace(ResourcePattern(TOPIC, "o", PatternType.PREFIXED), frozenset())
    assert may(auth, Op.READ, "orders")
    assert len(auth.acls) == 0


def test_authorize_by_resource_type() -> None:
    auth = authorizer()
    assert not auth.authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC)
    add(auth, "orders-", Op.WRITE, pattern_type=PatternType.PREFIXED)
    assert auth.authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC)
    add(auth, "orders", Op.WRITE, DENY, pattern_type=PatternType.PREFIXED)
    assert not auth.authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC)
    add(auth, "payments", Op.ALL)
    assert auth.authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC)
    add(auth, "*", Op.WRITE, DENY)
    assert not auth.authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC)


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"authorizer.class.name": "com.example.MyAuthorizer"}, "authorizer.class.name"),
        (
            {
                "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                "super.users": "admin",
            },
            "super.users",
        ),
        (
            {
                "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                "allow.everyone.if.no.acl.found": "yes",
            },
            "allow.everyone.if.no.acl.found",
        ),
    ],
)
def test_bad_configuration_is_refused_naming_the_property(
    properties: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        AuthorizerConfig.from_properties(properties)


def test_without_a_class_name_there_is_no_authorizer() -> None:
    assert AuthorizerConfig.from_properties({"super.users": "User:admin"}) is None
    config = AuthorizerConfig.from_properties(
        {
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:admin;User:broker",
        }
    )
    assert config is not None
    assert config.super_users == {"User:admin", "User:broker"}
    assert not config.allow_everyone_if_no_acl_found
