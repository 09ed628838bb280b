"""ACLs in the metadata store, in Kafka's ZooKeeper layout: written conditionally (two
brokers adding to one pattern at once both land), followed by every broker's cache,
deleted by filters, with Kafka's change notices."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tierbroker.broker.metadata import zk_acls
from tierbroker.broker.metadata.acl_changes import create_acls, delete_acls
from tierbroker.broker.metadata.acl_store import NOTICES_KEPT, AclStore
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
from tierbroker.broker.security.authorizer.acl_cache import AclCache

ORDERS = ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL)
ORDERS_PREFIX = ResourcePattern(ResourceType.TOPIC, "orders-", PatternType.PREFIXED)


def entry(principal: str, op: AclOperation = AclOperation.READ) -> AccessControlEntry:
    return AccessControlEntry(principal, "*", op, AclPermissionType.ALLOW)


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[AclStore, AclStore]]:
    server = InProcessZooKeeper(tmp_path / "metadata.db")
    await server.open()
    made = []
    for _ in range(2):
        session = server.session()
        await session.start()
        store = AclStore(session, AclCache())
        await store.start()
        made.append(store)
    yield made[0], made[1]
    for store in made:
        await store.close()
        await store.store.close()
    await server.close()


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the ACL caches did not converge"
        await asyncio.sleep(0.01)


async def test_concurrent_creations_on_two_brokers_both_land_and_both_see_them(
    stores: tuple[AclStore, AclStore],
) -> None:
    one, two = stores
    alice, bob = entry("User:alice"), entry("User:bob")
    await asyncio.gather(
        one.update(ORDERS, lambda acls: acls | {alice}),
        two.update(ORDERS, lambda acls: acls | {bob}),
    )
    assert await one.read(ORDERS) == {alice, bob}
    await until(lambda: one.cache.get(ORDERS) == {alice, bob} == two.cache.get(ORDERS))


async def test_kafkas_layout_json_and_change_notices(stores: tuple[AclStore, AclStore]) -> None:
    one, _ = stores
    deny = AccessControlEntry(
        "User:bob", "10.0.0.1", AclOperation.DESCRIBE_CONFIGS, AclPermissionType.DENY
    )
    await one.update(ORDERS_PREFIX, lambda acls: acls | {deny})
    await one.update(ORDERS, lambda acls: acls | {entry("User:alice")})
    data, _ = await one.store.get("/kafka-acl-extended/prefixed/Topic/orders-")
    assert json.loads(data) == {
        "version": 1,
        "acls": [
            {
                "principal": "User:bob",
                "permissionType": "Deny",
                "operation": "DescribeConfigs",
                "host": "10.0.0.1",
            }
        ],
    }
    assert (
        json.loads((await one.store.get("/kafka-acl/Topic/orders"))[0])["acls"][0]["operation"]
        == "Read"
    )
    literal = await one.store.children(zk_acls.LITERAL_CHANGES)
    assert [(await one.store.get(f"{zk_acls.LITERAL_CHANGES}/{n}"))[0] for n in literal] == [
        b"TOPIC:orders"
    ]
    (extended,) = await one.store.children(zk_acls.EXTENDED_CHANGES)
    notice = json.loads((await one.store.get(f"{zk_acls.EXTENDED_CHANGES}/{extended}"))[0])
    assert notice == {
        "version": 1,
        "resourceType": "TOPIC",
        "name": "orders-",
        "patternType": "PREFIXED",
    }


async def test_written_by_hand_in_kafkas_layout_is_followed(
    stores: tuple[AclStore, AclStore],
) -> None:
    one, _ = stores
    group = ResourcePattern(ResourceType.GROUP, "g1", PatternType.LITERAL)
    body = (
        b'{"version":1,"acls":[{"principal":"User:carol","permissionType":"Allow",'
        b'"operation":"Read","host":"*"}]}'
    )
    await one.store.create("/kafka-acl/Group/g1", body)
    await until(lambda: one.cache.get(group) == {entry("User:carol")})
    await one.store.delete("/kafka-acl/Group/g1")
    await until(lambda: not one.cache.get(group))


async def test_deletion_by_filters_reports_each_acl_once(stores: tuple[AclStore, AclStore]) -> None:
    one, two = stores
    bindings = [
        AclBinding(ORDERS, entry("User:alice")),
        AclBinding(ORDERS, entry("User:alice", AclOperation.WRITE)),
        AclBinding(ORDERS_PREFIX, entry("User:bob")),
        AclBinding(ResourcePattern(ResourceType.TOPIC, "", PatternType.LITERAL), entry("User:x")),
    ]
    results = await create_acls(one, bindings)
    assert results[:3] == [None, None, None]
    assert results[3] is not None and results[3].invalid
    everything_of_alice = AclBindingFilter(
        resource_type=ResourceType.ANY,
        name=None,
        pattern_type=PatternType.ANY,
        principal="User:alice",
        host=None,
        operation=AclOperation.ANY,
        permission_type=AclPermissionType.ANY,
    )
    matching_orders_eu = AclBindingFilter(
        resource_type=ResourceType.TOPIC,
        name="orders-eu",
        pattern_type=PatternType.MATCH,
        principal=None,
        host=None,
        operation=AclOperation.ANY,
        permission_type=AclPermissionType.ANY,
    )
    assert one.cache.bindings(matching_orders_eu) == [bindings[2]]
    deleted = await delete_acls(two, [everything_of_alice, everything_of_alice])
    assert sorted(d.binding.entry.operation for d in deleted[0]) == [
        AclOperation.READ,
        AclOperation.WRITE,
    ]
    assert deleted[1] == []
    assert await one.read(ORDERS) == frozenset()
    assert await one.store.exists(zk_acls.resource_path(ORDERS)) is None
    await until(lambda: one.cache.bindings(everything_of_alice) == [])


async def test_a_lost_session_reads_everything_again(tmp_path: Path) -> None:
    server = InProcessZooKeeper(tmp_path / "metadata.db")
    await server.open()
    session, other = server.session(), server.session()
    await session.start()
    await other.start()
    store, writer = AclStore(session, AclCache()), AclStore(other, AclCache())
    await store.start()
    await writer.start()
    await session.expire()
    await writer.update(ORDERS, lambda acls: acls | {entry("User:alice")})
    await until(lambda: store.cache.get(ORDERS) == {entry("User:alice")})
    for s in (store, writer):
        await s.close()
        await s.store.close()
    await server.close()


async def test_only_the_newest_change_notices_are_kept(stores: tuple[AclStore, AclStore]) -> None:
    one, _ = stores
    for i in range(NOTICES_KEPT + 5):
        await one.update(ORDERS, lambda acls, i=i: acls | {entry(f"User:u{i}")})
    notices = sorted(await one.store.children(zk_acls.LITERAL_CHANGES))
    assert len(notices) == NOTICES_KEPT
    last, _ = await one.store.get(f"{zk_acls.LITERAL_CHANGES}/{notices[-1]}")
    assert last == b"TOPIC:orders"
    assert len(await one.read(ORDERS)) == NOTICES_KEPT + 5
