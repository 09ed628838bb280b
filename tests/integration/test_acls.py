"""ACLs against a broker with Kafka's StandardAuthorizer configured, through confluent-kafka.

The client here is User:ANONYMOUS (PLAINTEXT), not a super user: without ACLs it is
refused with each API's code, after CreateAcls it may, a DENY overrides an ALLOW, and it
cannot grant itself ACLs until an operator (writing Kafka's ZooKeeper layout, as
`kafka-acls --authorizer-properties zookeeper.connect=...` does) lets it alter the cluster.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.apache_kafka import run_tool
from tests.integration.broker_process import executable
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient, request_module
from tierbroker.broker.metadata.store import put
from tierbroker.broker.security.authorizer.acl import AclOperation as AclOperation_
from tierbroker.broker.security.authorizer.acl import PatternType, ResourcePattern
from tierbroker.broker.security.authorizer.acl import ResourceType as ResourceType_
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.protocol.errors import ErrorCode

ANONYMOUS = "User:ANONYMOUS"
CLUSTER_ZNODE = "/kafka-acl/Cluster/kafka-cluster"
CLUSTER_PATTERN = ResourcePattern(ResourceType_.CLUSTER, "kafka-cluster", PatternType.LITERAL)
PROPERTIES = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:admin",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "log.dir.min.free.bytes": "0",
    "group.initial.rebalance.delay.ms": "0",
}
EVERYTHING = AclBindingFilter(
    ResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("acls")
    with EmbeddedCluster(directory, properties=PROPERTIES) as cluster:
        broker = cluster.brokers[0]
        for topic in ("orders", "orders-eu", "payments"):
            cluster.call(broker.admin.create_topic(topic, 1, 1, {}))
        yield cluster


@pytest.fixture
def admin(cluster: EmbeddedCluster) -> Iterator[AdminClient]:
    """An admin client, and no ACL but the operator's grant of ALTER and DESCRIBE on the
    cluster to User:ANONYMOUS, before and after the test."""
    operator_grants(cluster, ["Alter", "Describe"])
    client = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for deleted in client.delete_acls([EVERYTHING], request_timeout=10).values():
        deleted.result(10)
    operator_grants(cluster, ["Alter", "Describe"])
    yield client
    operator_grants(cluster, ["Alter", "Describe"])
    for deleted in client.delete_acls([EVERYTHING], request_timeout=10).values():
        deleted.result(10)


def operator_grants(cluster: EmbeddedCluster, operations: list[str]) -> None:
    """Write the cluster's ACLs into the metadata store directly, as an operator with
    access to ZooKeeper does, and wait until the broker has them."""
    broker = cluster.brokers[0]
    acls = [
        {"principal": ANONYMOUS, "permissionType": "Allow", "operation": op, "host": "*"}
        for op in operations
    ]
    cluster.call(
        put(broker.store, CLUSTER_ZNODE, json.dumps({"version": 1, "acls": acls}).encode())
    )
    authorizer = broker.authorizer
    assert authorizer is not None
    wanted = {AclOperation_.parse(op) for op in operations}

    def seen() -> bool:
        return {e.operation for e in authorizer.acls.get(CLUSTER_PATTERN)} == wanted

    wait_for(lambda: cluster.read(seen), "the broker to see the operator's ACLs", timeout_s=10)


def allow(
    name: str,
    operation: AclOperation,
    restype: ResourceType = ResourceType.TOPIC,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(restype, name, pattern, ANONYMOUS, "*", operation, permission)


def create(admin: AdminClient, *bindings: AclBinding) -> None:
    for result in admin.create_acls(list(bindings), request_timeout=10).values():
        result.result(10)


def produce_error(cluster: EmbeddedCluster, topic: str) -> KafkaError | None:
    """The error of producing one record to `topic`, None if it was stored."""
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "message.timeout.ms": 10_000}
    )
    outcome: list[KafkaError | None] = []
    producer.produce(topic, b"value", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(15)
    assert outcome, "the delivery report never came"
    return outcome[0]


def test_without_acls_every_api_is_refused_with_its_code(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    error = produce_error(cluster, "orders")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert admin.list_topics(timeout=10).topics == {}  # Metadata hides every topic
    named = admin.list_topics(topic="orders", timeout=10).topics["orders"]
    assert named.error is not None
    assert named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    for futures in (
        admin.create_topics([NewTopic("new-topic", 1, 1)], request_timeout=10),
        admin.delete_topics(["orders"], request_timeout=10),
    ):
        for future in futures.values():
            with pytest.raises(KafkaException) as refused:
                future.result(10)
            assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_after_create_acls_it_works_and_describe_lists_them(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    create(admin, allow("orders", AclOperation.WRITE))
    assert produce_error(cluster, "orders") is None
    assert set(admin.list_topics(timeout=10).topics) == {"orders"}  # WRITE implies DESCRIBE
    listed = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            None,
            ResourcePatternType.ANY,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        ),
        request_timeout=10,
    ).result(10)
    assert listed == [allow("orders", AclOperation.WRITE)]


def test_a_prefixed_acl_allows_the_names_it_starts(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    create(admin, allow("orders-", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED))
    assert produce_error(cluster, "orders-eu") is None
    error = produce_error(cluster, "orders")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_deny_overrides_allow(cluster: EmbeddedCluster, admin: AdminClient) -> None:
    create(
        admin,
        allow("payments", AclOperation.ALL),
        allow(
            "pay",
            AclOperation.WRITE,
            pattern=ResourcePatternType.PREFIXED,
            permission=AclPermissionType.DENY,
        ),
    )
    error = produce_error(cluster, "payments")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    deleted = admin.delete_acls(
        [
            AclBindingFilter(
                ResourceType.TOPIC,
                "pay",
                ResourcePatternType.PREFIXED,
                None,
                None,
                AclOperation.ANY,
                AclPermissionType.DENY,
            )
        ],
        request_timeout=10,
    )
    assert [b.name for f in deleted.values() for b in f.result(10)] == ["pay"]
    assert produce_error(cluster, "payments") is None


def test_a_principal_without_alter_on_the_cluster_cannot_grant_itself_acls(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    operator_grants(cluster, ["Describe"])
    futures = admin.create_acls([allow("orders", AclOperation.ALL)], request_timeout=10)
    for future in futures.values():
        with pytest.raises(KafkaException) as refused:
            future.result(10)
        assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    error = produce_error(cluster, "orders")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_group_needs_read_on_the_group(cluster: EmbeddedCluster, admin: AdminClient) -> None:
    create(admin, allow("orders", AclOperation.READ))
    assert consumer_error(cluster, "g1") == KafkaError.GROUP_AUTHORIZATION_FAILED
    create(admin, allow("g1", AclOperation.READ, ResourceType.GROUP))
    assert consumer_error(cluster, "g1") is None


def consumer_error(cluster: EmbeddedCluster, group: str) -> int | None:
    """The error a consumer of `orders` in `group` meets, None once it is assigned."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe(["orders"])

        def outcome() -> tuple[int | None] | None:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                return (message.error().code(),)
            return (None,) if consumer.assignment() else None

        return wait_for(outcome, "the consumer to be assigned or refused", timeout_s=30)[0]
    finally:
        consumer.close()


def test_a_transactional_producer_needs_write_on_its_transactional_id(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    create(admin, allow("orders", AclOperation.WRITE))
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": "tx-1"}
    )
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(10)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_cluster_admin_apis_need_the_cluster(cluster: EmbeddedCluster, admin: AdminClient) -> None:
    create(admin, allow("orders", AclOperation.READ))
    operator_grants(cluster, ["IdempotentWrite"])  # neither ALTER nor DESCRIBE
    # librdkafka drops DescribeAcls' error code: the refusal reads as an empty listing.
    assert admin.describe_acls(EVERYTHING, request_timeout=10).result(10) == []
    for future in (
        *admin.create_acls([allow("orders", AclOperation.ALL)], request_timeout=10).values(),
        *admin.describe_configs(
            [ConfigResource(ConfigResource.Type.BROKER, "0")], request_timeout=10
        ).values(),
    ):
        with pytest.raises(KafkaException) as refused:
            future.result(10)
        assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # SCRAM users are the cluster's too (KIP-554): ALTER to change, DESCRIBE to list.
    scram = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    alteration = UserScramCredentialUpsertion("alice", scram, b"password")
    [altered] = admin.alter_user_scram_credentials([alteration], request_timeout=10).values()
    with pytest.raises(KafkaException) as refused:
        altered.result(10)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # (librdkafka 2.16 corrupts its heap freeing a refused DescribeUserScramCredentials.)
    port = int(cluster.bootstrap_servers.rsplit(":", 1)[1])
    with WireClient(port) as wire:
        described = wire.request(
            request_module(50, 0).DescribeUserScramCredentialsRequest(users=None)
        )
    assert described.error_code == ErrorCode.cluster_authorization_failed
    assert described.results == ()


def tierbroker_acl(cluster: EmbeddedCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            executable("tierbroker", "pip install -e ."),
            "acl",
            *args,
            "-b",
            cluster.bootstrap_servers,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_tierbroker_acl_adds_lists_and_removes(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    added = tierbroker_acl(
        cluster,
        "add",
        "--allow-principal",
        "User:alice",
        "--allow-principal",
        "User:bob",
        "--operation",
        "Read",
        "--operation",
        "Describe",
        "--topic",
        "orders-",
        "--resource-pattern-type",
        "prefixed",
    )
    assert added.returncode == 0, added.stderr
    assert added.stderr == "added 4 ACLs\n"
    listed = tierbroker_acl(
        cluster,
        "list",
        "--topic",
        "orders-eu",
        "--resource-pattern-type",
        "match",
        "--output",
        "json",
    )
    assert listed.returncode == 0, listed.stderr
    assert sorted((a["principal"], a["operation"]) for a in json.loads(listed.stdout)) == [
        ("User:alice", "DESCRIBE"),
        ("User:alice", "READ"),
        ("User:bob", "DESCRIBE"),
        ("User:bob", "READ"),
    ]
    removed = tierbroker_acl(
        cluster,
        "remove",
        "--allow-principal",
        "User:bob",
        "--topic",
        "orders-",
        "--resource-pattern-type",
        "prefixed",
        "--output",
        "json",
    )
    assert removed.returncode == 0, removed.stderr
    assert len(json.loads(removed.stdout)) == 2
    left = admin.describe_acls(EVERYTHING, request_timeout=10).result(10)
    assert {b.principal for b in left if b.restype == ResourceType.TOPIC} == {"User:alice"}
    bad = tierbroker_acl(
        cluster, "add", "--allow-principal", "alice", "--operation", "Read", "--topic", "t"
    )
    assert bad.returncode != 0 and "Type:name" in bad.stderr
    operator_grants(cluster, [])
    refused = tierbroker_acl(cluster, "list")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: list ACLs: CLUSTER_AUTHORIZATION_FAILED"), (
        refused.stderr
    )


def test_kafkas_own_kafka_acls_manages_them(cluster: EmbeddedCluster, admin: AdminClient) -> None:
    def kafka_acls(*args: str) -> str:
        return run_tool("AclCommand", "--bootstrap-server", cluster.bootstrap_servers, *args)

    kafka_acls(
        "--add",
        "--allow-principal",
        "User:carol",
        "--operation",
        "Write",
        "--operation",
        "Describe",
        "--topic",
        "payments",
    )
    kafka_acls(
        "--add", "--allow-principal", "User:carol", "--operation", "Describe", "--group", "billing"
    )
    listed = kafka_acls("--list", "--topic", "payments")
    assert "principal=User:carol, host=*, operation=WRITE, permissionType=ALLOW" in listed
    assert "principal=User:carol, host=*, operation=DESCRIBE, permissionType=ALLOW" in listed
    kafka_acls(
        "--add",
        "--deny-principal",
        "User:carol",
        "--deny-host",
        "10.0.0.9",
        "--operation",
        "Read",
        "--group",
        "billing",
        "--resource-pattern-type",
        "prefixed",
    )
    found = admin.describe_acls(EVERYTHING, request_timeout=10).result(10)
    assert {
        (b.restype, b.name, b.resource_pattern_type, b.operation, b.permission_type)
        for b in found
        if b.principal == "User:carol"
    } == {
        (
            ResourceType.TOPIC,
            "payments",
            ResourcePatternType.LITERAL,
            AclOperation.WRITE,
            AclPermissionType.ALLOW,
        ),
        (
            ResourceType.TOPIC,
            "payments",
            ResourcePatternType.LITERAL,
            AclOperation.DESCRIBE,
            AclPermissionType.ALLOW,
        ),
        (
            ResourceType.GROUP,
            "billing",
            ResourcePatternType.LITERAL,
            AclOperation.DESCRIBE,
            AclPermissionType.ALLOW,
        ),
        (
            ResourceType.GROUP,
            "billing",
            ResourcePatternType.PREFIXED,
            AclOperation.READ,
            AclPermissionType.DENY,
        ),
    }
    kafka_acls("--remove", "--force", "--topic", "payments", "--group", "billing")
    found = admin.describe_acls(EVERYTHING, request_timeout=10).result(10)
    assert [b for b in found if b.principal == "User:carol"] == [
        AclBinding(
            ResourceType.GROUP,
            "billing",
            ResourcePatternType.PREFIXED,
            "User:carol",
            "10.0.0.9",
            AclOperation.READ,
            AclPermissionType.DENY,
        )
    ]
