"""Client quotas in the metadata store: Kafka's znodes, change notices that reach every
broker, and a user's other configs (SCRAM credentials) left as they were."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest

from tierbroker.broker.metadata import config_changes
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.inprocess_store import InProcessSession, InProcessZooKeeper
from tierbroker.broker.quota.entity import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaEntity,
)
from tierbroker.broker.quota.quota_store import ClientQuotaStore, parse_entity_path
from tierbroker.protocol.errors import ErrorCode, KafkaError

SCRAM = "SCRAM-SHA-512"


@pytest.fixture
async def sessions() -> AsyncIterator[Callable[[], InProcessSession]]:
    server = InProcessZooKeeper(None)
    await server.open()
    opened: list[InProcessSession] = []

    def session() -> InProcessSession:
        opened.append(server.session())
        return opened[-1]

    first = session()
    await first.start()
    for path in zk.PERSISTENT_PATHS:
        await first.create(path, make_parents=True)
    yield session
    await server.close()


async def _started(session: InProcessSession) -> ClientQuotaStore:
    if session.session_id == 0:
        await session.start()
    store = ClientQuotaStore(session)
    await store.start()
    return store


async def _until(condition: Callable[[], bool]) -> None:
    """Poll until a broker's own task has applied what another wrote."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_quotas_are_kafkas_znodes_and_reach_every_broker(
    sessions: Callable[[], InProcessSession],
) -> None:
    one, two = sessions(), sessions()
    await two.start()
    writer, reader = await _started(one), await _started(two)
    try:
        alice_app = QuotaEntity("alice", "app")
        await writer.alter(alice_app, {PRODUCER_BYTE_RATE: 1024.0, REQUEST_PERCENTAGE: 50.0})
        await writer.alter(QuotaEntity(None, DEFAULT), {CONSUMER_BYTE_RATE: 2048.0})
        data, _ = await one.get("/config/users/alice/clients/app")
        assert json.loads(data) == {
            "version": 1,
            "config": {"producer_byte_rate": "1024", "request_percentage": "50.0"},
        }
        data, _ = await one.get("/config/clients/<default>")
        assert json.loads(data)["config"] == {"consumer_byte_rate": "2048"}
        notices = await one.children(zk.CONFIG_CHANGES)
        paths = [
            config_changes.decode_notice((await one.get(f"{zk.CONFIG_CHANGES}/{n}"))[0])
            for n in notices
        ]
        assert paths == ["users/alice/clients/app", "clients/<default>"]
        assert writer.quotas.quotas[alice_app] == {
            PRODUCER_BYTE_RATE: 1024.0,
            REQUEST_PERCENTAGE: 50.0,
        }
        await _until(lambda: reader.quotas.quotas == writer.quotas.quotas)
        await writer.alter(alice_app, {PRODUCER_BYTE_RATE: None, REQUEST_PERCENTAGE: None})
        await _until(lambda: alice_app not in reader.quotas.quotas)
    finally:
        await writer.close()
        await reader.close()


async def test_a_users_scram_credentials_are_kept(
    sessions: Callable[[], InProcessSession],
) -> None:
    session = sessions()
    store = await _started(session)
    try:
        credential = "salt=c2FsdA==,stored_key=a2V5,server_key=c2Vydg==,iterations=4096"
        await session.create("/config/users/bob", zk.encode_config({SCRAM: credential}))
        await store.alter(QuotaEntity("bob"), {PRODUCER_BYTE_RATE: 100.0})
        await store.alter(QuotaEntity("bob"), {PRODUCER_BYTE_RATE: None})
        data, _ = await session.get("/config/users/bob")
        assert zk.decode_config(data) == {SCRAM: credential}
        assert QuotaEntity("bob") not in store.quotas.quotas  # credentials are no quota
    finally:
        await store.close()


async def test_names_are_sanitized_in_paths(sessions: Callable[[], InProcessSession]) -> None:
    session = sessions()
    store = await _started(session)
    try:
        entity = QuotaEntity("CN=Alice Smith,O=Example", "<default>")  # a client named so
        await store.alter(entity, {CONSUMER_BYTE_RATE: 10.0})
        users = await session.children(zk.USER_CONFIGS)
        assert users == ["CN%3DAlice%20Smith%2CO%3DExample"]
        assert await session.children(f"{zk.USER_CONFIGS}/{users[0]}/clients") == ["%3Cdefault%3E"]
        assert (
            parse_entity_path("users/CN%3DAlice%20Smith%2CO%3DExample/clients/%3Cdefault%3E")
            == entity
        )
        restarted = await _started(session)
        assert restarted.quotas.quotas == {entity: {CONSUMER_BYTE_RATE: 10.0}}
        await restarted.close()
    finally:
        await store.close()


async def test_a_listener_that_missed_purged_notices_reads_everything(
    sessions: Callable[[], InProcessSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_changes, "KEPT_NOTICES", 2)
    writer, follower = sessions(), sessions()
    await writer.start()
    await follower.start()
    handled: list[list[str] | None] = []
    busy = asyncio.Event()
    release = asyncio.Event()

    async def handler(paths: list[str] | None) -> None:
        handled.append(paths)
        if len(handled) == 1:
            busy.set()
            await release.wait()  # held up while notices are written and purged

    listener = config_changes.ConfigChangeListener(follower, handler)
    await listener.start()
    try:
        await config_changes.notify_change(writer, "users/a")
        await busy.wait()
        for user in "bcde":
            await config_changes.notify_change(writer, f"users/{user}")
        assert len(await writer.children(zk.CONFIG_CHANGES)) == 2
        release.set()
        await _until(lambda: len(handled) == 2)
        assert handled == [["users/a"], None]  # users/b and c are gone: read everything
        await config_changes.notify_change(writer, "users/f")
        await _until(lambda: len(handled) == 3)
        assert handled[2] == ["users/f"]
    finally:
        await listener.close()


async def test_a_znode_another_tool_wrote_badly_is_neither_read_nor_overwritten(
    sessions: Callable[[], InProcessSession],
) -> None:
    session = sessions()
    await session.start()
    await session.create("/config/clients/odd", b"not json")
    await session.create("/config/clients/fine", zk.encode_config({PRODUCER_BYTE_RATE: "10"}))
    store = await _started(session)
    try:
        assert store.quotas.quotas == {QuotaEntity(None, "fine"): {PRODUCER_BYTE_RATE: 10.0}}
        with pytest.raises(KafkaError) as refused:
            await store.alter(QuotaEntity(None, "odd"), {PRODUCER_BYTE_RATE: 1.0})
        assert refused.value.code == ErrorCode.unknown_server_error
        assert (await session.get("/config/clients/odd"))[0] == b"not json"
    finally:
        await store.close()
