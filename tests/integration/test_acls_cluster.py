"""ACLs across three brokers, in process and over a real ZooKeeper: an ACL created
through one broker is seen by every broker (each answers DescribeAcls from its own view),
ACLs created on one pattern through two brokers at once both land, and the cluster
replicates as usual with its brokers' principal (User:ANONYMOUS on PLAINTEXT) a super user.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.describe_acls.v3 import request as describe_acls
from kio.static.primitive import i8

from tests.integration.waiting import wait_for
from tests.integration.zk_cluster import (
    ZooKeeperCluster,
    zookeeper,  # noqa: F401 (a fixture)
)
from tests.zookeeper import ZooKeeperServer
from tierbroker.broker.network.broker_client import BrokerClients
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.testing.clients import produce

SECURED = {
    "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
    # The brokers' own principal: without it, brokers may not fetch from each other.
    "super.users": "User:ANONYMOUS",
    "offsets.topic.num.partitions": "3",
    "log.dir.min.free.bytes": "0",
}


def acl(principal: str, name: str = "orders") -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        name,
        ResourcePatternType.LITERAL,
        principal,
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )


def principals_seen_by(address: str) -> set[str]:
    """The principals of the ACLs on topic `orders` as the broker at `address` knows them
    (DescribeAcls to that broker alone)."""

    async def ask() -> set[str]:
        clients = BrokerClients("acl-test", 5000)
        host, port = address.rsplit(":", 1)
        try:
            answer = await clients.get(host, int(port)).send(
                describe_acls.DescribeAclsRequest(
                    resource_type_filter=i8(2),
                    resource_name_filter="orders",
                    pattern_type_filter=i8(3),
                    principal_filter=None,
                    host_filter=None,
                    operation=i8(1),
                    permission_type=i8(1),
                )
            )
        finally:
            await clients.close()
        return {a.principal for r in answer.resources for a in r.acls}

    return asyncio.run(ask())


def assert_every_broker_sees(addresses: list[str], admin: AdminClient) -> None:
    """Create ACLs through one broker, then through two at once: each broker lists them."""
    for future in admin.create_acls([acl("User:alice")], request_timeout=10).values():
        future.result(10)
    for address in addresses:
        wait_for(
            lambda a=address: principals_seen_by(a) == {"User:alice"},
            f"broker {address} to see the ACL",
            timeout_s=10,
        )
    two = [AdminClient({"bootstrap.servers": a}) for a in addresses[1:]]
    futures = [
        f
        for client, who in zip(two, ("User:bob", "User:carol"), strict=True)
        for f in client.create_acls([acl(who)], request_timeout=10).values()
    ]
    for future in futures:
        future.result(10)
    for address in addresses:
        wait_for(
            lambda a=address: principals_seen_by(a) == {"User:alice", "User:bob", "User:carol"},
            f"broker {address} to see every ACL",
            timeout_s=10,
        )


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("acls-cluster")
    with EmbeddedCluster(directory, brokers=3, properties=SECURED) as cluster:
        yield cluster


def test_acls_reach_every_broker_in_process(in_process: EmbeddedCluster) -> None:
    admin = AdminClient({"bootstrap.servers": in_process.bootstrap_servers})
    assert_every_broker_sees([in_process.address(b.broker_id) for b in in_process.brokers], admin)


def test_brokers_replicate_with_their_principal_a_super_user(in_process: EmbeddedCluster) -> None:
    broker = in_process.brokers[0]
    in_process.call(broker.admin.create_topic("replicated", 1, 3, {}))
    tp = TopicPartition("replicated", 0)
    produced = produce(in_process.bootstrap_servers, "replicated", [b"x"] * 10)
    assert [offset for _, offset in produced] == list(range(10))

    def replicated() -> bool:
        return all(
            in_process.read(lambda b=b: b.replicas.partitions[tp].log.log_end_offset) == 10
            for b in in_process.brokers
        )

    wait_for(replicated, "every replica to fetch the records", timeout_s=30)


def test_acls_reach_every_broker_over_zookeeper(
    zookeeper: ZooKeeperServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    cluster = ZooKeeperCluster(zookeeper, tmp_path, overrides=SECURED).start()
    try:
        assert_every_broker_sees([b.bootstrap for b in cluster.brokers.values()], cluster.admin())
    finally:
        cluster.stop()
