"""ACLs for principals that authenticated, through confluent-kafka: two SASL PLAIN users
(alice may write topic `orders`, bob may not; a DENY for alice on her host; bob cannot
grant himself ACLs), and a mutual-TLS principal, its certificate's subject, granted READ
and WRITE by ACLs and refused without them. Then KIP-430: describe_topics,
describe_cluster and describe_consumer_groups with include_authorized_operations answer
what each principal may do, as Kafka encodes it, and as Apache Kafka answers for the
same ACLs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka import TopicPartition as Partition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.apache_kafka import ApacheKafka
from tests.certs import STORE_PASSWORD, Certificates
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
USERS_JAAS = (
    f'{PLAIN_MODULE} required username="admin" password="admin-pw" '
    'user_admin="admin-pw" user_alice="alice-pw" user_bob="bob-pw";'
)
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CERTIFICATE_PRINCIPAL = "User:CN=client,O=tierbroker-tests"
TIMEOUT_S = 30.0
EVERY_ACL = AclBindingFilter(
    ResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("acl-principals")
    properties = {
        "listeners": "SASL://127.0.0.1:0,MTLS://127.0.0.1:0",
        "listener.security.protocol.map": "SASL:SASL_PLAINTEXT,MTLS:SSL",
        "inter.broker.listener.name": "SASL",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl.plain.sasl.jaas.config": USERS_JAAS,
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca.cert),
        "listener.name.mtls.ssl.client.auth": "required",
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:admin",
        "offsets.topic.num.partitions": "1",
        "log.dir.min.free.bytes": "0",
        "group.initial.rebalance.delay.ms": "0",
    }
    with EmbeddedCluster(directory, properties=properties) as cluster:
        broker = cluster.brokers[0]
        for topic in ("orders", "payments"):
            cluster.call(broker.admin.create_topic(topic, 1, 1, {}))
        yield cluster


def as_user(cluster: EmbeddedCluster, user: str) -> dict[str, str]:
    endpoint = cluster.brokers[0].endpoints.listener("SASL")
    return plain_login(f"{endpoint.host}:{endpoint.port}", user)


def plain_login(bootstrap: str, user: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": user,
        "sasl.password": f"{user}-pw",
    }


def as_certificate(cluster: EmbeddedCluster, certs: Certificates) -> dict[str, str]:
    endpoint = cluster.brokers[0].endpoints.listener("MTLS")
    return {
        "bootstrap.servers": f"{endpoint.host}:{endpoint.port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs.ca.cert),
        "ssl.certificate.location": str(certs.client.cert),
        "ssl.key.location": str(certs.client.key),
    }


@pytest.fixture
def admin(cluster: EmbeddedCluster) -> Iterator[AdminClient]:
    """The super user's admin client; every ACL is deleted after the test."""
    client = AdminClient(as_user(cluster, "admin"))
    yield client
    client.delete_acls([EVERY_ACL], request_timeout=10)[EVERY_ACL].result(10)


def binding(
    principal: str,
    operation: AclOperation,
    resource: ResourceType = ResourceType.TOPIC,
    name: str = "orders",
    host: str = "*",
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(
        resource, name, ResourcePatternType.LITERAL, principal, host, operation, permission
    )


def grant(admin: AdminClient, *bindings: AclBinding) -> None:
    for future in admin.create_acls(list(bindings), request_timeout=10).values():
        future.result(10)


def produce_error(config: dict[str, str], topic: str = "orders") -> int | None:
    """Produce one record; the delivery's error code, None when it was written."""
    errors: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 10_000})
    producer.produce(topic, b"x", on_delivery=lambda e, _m: errors.append(e))
    producer.flush(TIMEOUT_S)
    assert len(errors) == 1
    return None if errors[0] is None else errors[0].code()


def consume_error(config: dict[str, str], topic: str = "orders") -> int | None:
    """Subscribe to `topic` from its start, in a group of its own: None once a record came,
    else the error the consumer was told."""
    consumer = Consumer(
        {**config, "group.id": f"reader-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])

    def answered() -> tuple[int | None] | None:
        message = consumer.poll(0.5)
        if message is None:
            return None
        error = message.error()
        return (None,) if error is None else (error.code(),)

    try:
        return wait_for(answered, f"a record or an error from {topic}", timeout_s=TIMEOUT_S)[0]
    finally:
        consumer.close()


def test_alice_may_write_orders_and_bob_may_not(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    grant(admin, binding("User:alice", AclOperation.WRITE))
    assert produce_error(as_user(cluster, "alice")) is None
    assert produce_error(as_user(cluster, "bob")) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(as_user(cluster, "alice"), "payments") == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )


def test_a_deny_for_alice_on_her_host_overrides_her_allow(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    alice = as_user(cluster, "alice")
    deny = AclPermissionType.DENY
    grant(
        admin,
        binding("User:alice", AclOperation.WRITE),
        binding("User:alice", AclOperation.WRITE, host="10.9.9.9", permission=deny),
    )
    assert produce_error(alice) is None  # denied on another host only
    grant(admin, binding("User:alice", AclOperation.WRITE, host="127.0.0.1", permission=deny))
    assert produce_error(alice) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_bob_cannot_grant_himself_acls(cluster: EmbeddedCluster, admin: AdminClient) -> None:
    bob = AdminClient(as_user(cluster, "bob"))
    future = bob.create_acls([binding("User:bob", AclOperation.WRITE)], request_timeout=10)
    with pytest.raises(KafkaException) as refused:
        next(iter(future.values())).result(10)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert produce_error(as_user(cluster, "bob")) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    listed = admin.describe_acls(EVERY_ACL, request_timeout=10).result(10)
    assert listed == []


def test_a_certificate_principal_is_granted_by_acls_and_refused_without(
    cluster: EmbeddedCluster, certs: Certificates, admin: AdminClient
) -> None:
    client = as_certificate(cluster, certs)
    grant(admin, binding(CERTIFICATE_PRINCIPAL, AclOperation.READ, ResourceType.GROUP, "*"))
    assert produce_error(client) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume_error(client) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(
        admin,
        binding(CERTIFICATE_PRINCIPAL, AclOperation.WRITE),
        binding(CERTIFICATE_PRINCIPAL, AclOperation.READ),
    )
    assert produce_error(client) is None
    assert consume_error(client) is None
    assert produce_error(as_user(cluster, "alice")) == KafkaError.TOPIC_AUTHORIZATION_FAILED


# KIP-430 --------------------------------------------------------------------------------


Operations = frozenset[AclOperation] | None  # None: the answer carried no list


def operations(found: Any) -> Operations:
    listed = found.authorized_operations
    return None if listed is None else frozenset(listed)


def alices_operations(alice_config: dict[str, str], admin: AdminClient) -> dict[str, Operations]:
    """Grant alice ACLs on topics `orders` and `payments`, a group and the cluster (ALL,
    implied operations, a DENY) through `admin`; what describe_topics, describe_cluster
    and describe_consumer_groups then tell her she may do."""
    group = f"alice-{uuid.uuid4().hex[:8]}"
    grant(
        admin,
        binding("User:alice", AclOperation.WRITE),
        binding("User:alice", AclOperation.READ),
        binding("User:alice", AclOperation.ALL, name="payments"),
        binding(
            "User:alice", AclOperation.WRITE, name="payments", permission=AclPermissionType.DENY
        ),
        binding("User:alice", AclOperation.READ, ResourceType.GROUP, group),
        binding("User:alice", AclOperation.ALTER_CONFIGS, ResourceType.BROKER, "kafka-cluster"),
    )
    consumer = Consumer({**alice_config, "group.id": group})
    consumer.commit(offsets=[Partition("orders", 0, 0)], asynchronous=False)
    consumer.close()
    alice = AdminClient(alice_config)
    answers: dict[str, Operations] = {}
    topics = alice.describe_topics(
        TopicCollection(["orders", "payments"]), include_authorized_operations=True
    )
    for name, future in topics.items():
        answers[name] = operations(future.result(TIMEOUT_S))
    described = alice.describe_cluster(include_authorized_operations=True)
    answers["cluster without DESCRIBE"] = operations(described.result(TIMEOUT_S))
    grant(admin, binding("User:alice", AclOperation.DESCRIBE, ResourceType.BROKER, "kafka-cluster"))
    described = alice.describe_cluster(include_authorized_operations=True)
    answers["cluster"] = operations(described.result(TIMEOUT_S))
    groups = alice.describe_consumer_groups([group], include_authorized_operations=True)
    answers["group"] = operations(groups[group].result(TIMEOUT_S))
    return answers


def test_authorized_operations_are_what_each_principal_may_do(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    Op = AclOperation
    assert alices_operations(as_user(cluster, "alice"), admin) == {
        # READ and WRITE imply DESCRIBE; ALL is every topic operation, less what is denied.
        "orders": {Op.READ, Op.WRITE, Op.DESCRIBE},
        "payments": {
            Op.READ,
            Op.CREATE,
            Op.DESCRIBE,
            Op.DELETE,
            Op.ALTER,
            Op.DESCRIBE_CONFIGS,
            Op.ALTER_CONFIGS,
        },
        # Without DESCRIBE on the cluster nothing of it is told (ALTER_CONFIGS implies only
        # DESCRIBE_CONFIGS): Kafka's 0, which librdkafka gives as no list.
        "cluster without DESCRIBE": None,
        "cluster": {Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS},
        "group": {Op.READ, Op.DESCRIBE},
    }


def test_authorized_operations_of_a_super_user_and_when_not_asked(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    orders = admin.describe_topics(TopicCollection(["orders"]), include_authorized_operations=True)
    every_topic_operation = operations(orders["orders"].result(TIMEOUT_S))
    assert every_topic_operation is not None and len(every_topic_operation) == 8
    described = admin.describe_cluster(include_authorized_operations=True).result(TIMEOUT_S)
    assert operations(described) == {
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    }
    not_asked = admin.describe_topics(TopicCollection(["orders"]))["orders"].result(TIMEOUT_S)
    assert not_asked.authorized_operations is None
    assert admin.describe_cluster().result(TIMEOUT_S).authorized_operations is None


@pytest.fixture(scope="module")
def apache_kafka_with_acls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """Apache Kafka (one KRaft node) with the same users on SASL PLAIN and the same
    authorizer; its controller listener stays in the clear, so User:ANONYMOUS (the node
    talking to itself) is a super user there too."""
    properties = {
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.plaintext.plain.sasl.jaas.config": USERS_JAAS,
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:admin;User:ANONYMOUS",
    }
    kafka = ApacheKafka(tmp_path_factory.mktemp("kafka-acls"), properties).start()
    admin = AdminClient(plain_login(kafka.bootstrap_servers, "admin"))
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in ("orders", "payments")]).values():
        future.result(TIMEOUT_S)
    yield kafka
    kafka.stop()


def test_authorized_operations_are_what_apache_kafka_answers(
    cluster: EmbeddedCluster, admin: AdminClient, apache_kafka_with_acls: ApacheKafka
) -> None:
    bootstrap = apache_kafka_with_acls.bootstrap_servers
    kafka_admin = AdminClient(plain_login(bootstrap, "admin"))
    kafkas = alices_operations(plain_login(bootstrap, "alice"), kafka_admin)
    assert alices_operations(as_user(cluster, "alice"), admin) == kafkas
