"""SCRAM credentials in the metadata store as Kafka keeps them: Kafka's znode layout beside
a user's quotas (left as they were), and a change made through one broker's store is seen
by another's through the change notices."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.inprocess_store import InProcessSession, InProcessZooKeeper
from tierbroker.broker.metadata.scram_credentials import (
    ScramCredentialStore,
    alter_credentials,
    user_path,
)
from tierbroker.broker.security.sasl.scram import ScramCredential, ScramMechanism

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[tuple[InProcessSession, InProcessSession]]:
    server = InProcessZooKeeper(tmp_path / "metadata.db")
    await server.open()
    first, second = server.session(), server.session()
    await first.start()
    await second.start()
    for path in zk.PERSISTENT_PATHS:
        await first.create(path, make_parents=True)
    yield first, second
    await first.close()
    await second.close()
    await server.close()


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the other broker did not see the change"
        await asyncio.sleep(0.01)


async def test_kafka_layout_beside_quotas(
    sessions: tuple[InProcessSession, InProcessSession],
) -> None:
    store, _ = sessions
    path = user_path("al ice*")
    assert path == "/config/users/al%20ice%2A"
    await store.create(path, zk.encode_config({"producer_byte_rate": "1024"}))
    credential = SHA256.new_credential("pw")
    await alter_credentials(store, "al ice*", {SHA256: credential})
    data, _ = await store.get(path)
    value = json.loads(data)
    assert value["version"] == 1
    assert value["config"]["producer_byte_rate"] == "1024"
    assert ScramCredential.decode(value["config"]["SCRAM-SHA-256"]) == credential
    notices = await store.children(zk.CONFIG_CHANGES)
    (notice,) = [json.loads((await store.get(f"{zk.CONFIG_CHANGES}/{n}"))[0]) for n in notices]
    assert notice == {"version": 2, "entity_path": "users/al%20ice%2A"}
    await alter_credentials(store, "al ice*", {SHA256: None})
    data, _ = await store.get(path)
    assert json.loads(data)["config"] == {"producer_byte_rate": "1024"}


async def test_another_broker_sees_changes(
    sessions: tuple[InProcessSession, InProcessSession],
) -> None:
    first, second = sessions
    await alter_credentials(first, "before", {SHA512: SHA512.new_credential("pw")})
    writer, follower = ScramCredentialStore(first), ScramCredentialStore(second)
    await writer.start()
    await follower.start()
    try:
        assert follower.lookup(SHA512, "before") is not None  # read at start
        credential = SHA512.new_credential("pw2")
        await writer.alter("alice", {SHA512: credential})
        assert writer.lookup(SHA512, "alice") == credential  # at once where written
        await until(lambda: follower.lookup(SHA512, "alice") == credential)
        assert follower.lookup(SHA256, "alice") is None
        await writer.alter("alice", {SHA512: None})
        await until(lambda: follower.lookup(SHA512, "alice") is None)
    finally:
        await writer.close()
        await follower.close()
