"""Client quotas over both metadata stores (in-process and a real ZooKeeper): written by
one broker as Kafka lays them out, seen by another through the change notices."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from tests.integration.test_metadata_store import Stores, stores, zookeeper
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.quota.entity import DEFAULT, PRODUCER_BYTE_RATE, QuotaEntity
from tierbroker.broker.quota.quota_store import ClientQuotaStore

__all__ = ["stores", "zookeeper"]  # the fixtures, shared with the store contract's tests


async def _until(condition: Callable[[], bool]) -> None:
    """Poll until the other broker's own task has applied the change."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_quotas_written_by_one_broker_are_in_force_on_another(stores: Stores) -> None:
    first, second = await stores.open(), await stores.open()
    for path in zk.PERSISTENT_PATHS:
        await first.create(path, make_parents=True)
    scram = "salt=c2FsdA==,stored_key=a2V5,server_key=c2Vydg==,iterations=4096"
    await first.create("/config/users/alice", zk.encode_config({"SCRAM-SHA-256": scram}))
    writer, reader = ClientQuotaStore(first), ClientQuotaStore(second)
    await writer.start()
    await reader.start()
    try:
        alice = QuotaEntity("alice", DEFAULT)
        await writer.alter(QuotaEntity("alice"), {PRODUCER_BYTE_RATE: 1000.0})
        await writer.alter(alice, {PRODUCER_BYTE_RATE: 500.0})
        await _until(lambda: len(reader.quotas.quotas) == 2)
        resolved = reader.quotas.resolve(PRODUCER_BYTE_RATE, "alice", "app")
        assert resolved is not None and resolved.bound == 500.0
        data, _ = await second.get("/config/users/alice")
        assert json.loads(data)["config"] == {
            "SCRAM-SHA-256": scram,
            "producer_byte_rate": "1000",
        }
        assert await second.children("/config/users/alice/clients") == ["<default>"]
        await writer.alter(alice, {PRODUCER_BYTE_RATE: None})
        await _until(lambda: alice not in reader.quotas.quotas)
    finally:
        await writer.close()
        await reader.close()
