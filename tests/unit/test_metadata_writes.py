"""A metadata write the in-process service cannot store (a full disk) changes nothing: the
client gets KAFKA_STORAGE_ERROR (a producer-id block: COORDINATOR_NOT_AVAILABLE), and what
was stored before is what a restart finds."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.unit.broker import running_broker
from tierbroker.broker.metadata.inprocess_store import InProcessZooKeeper, StorageUnavailable
from tierbroker.broker.metadata.store import BadVersionError
from tierbroker.broker.metadata.znode_db import ZnodeDatabase
from tierbroker.protocol.errors import ErrorCode, KafkaError


class FullDisk:
    """Makes every store write fail with ENOSPC until healed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        real = ZnodeDatabase.write

        def write(db: ZnodeDatabase, writes: list[object]) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(db, writes)  # type: ignore[arg-type]

        monkeypatch.setattr(ZnodeDatabase, "write", write)


async def test_a_write_that_cannot_be_stored_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch)
    server = InProcessZooKeeper(tmp_path / "metadata.db")
    await server.open()
    store = server.session()
    await store.start()
    await store.create("/a", b"1")
    disk.full = True
    with pytest.raises(StorageUnavailable):
        await store.set("/a", b"2")
    with pytest.raises(StorageUnavailable):
        await store.create("/b", b"")
    assert (await store.get("/a"))[0] == b"1"
    assert await store.exists("/b") is None
    with pytest.raises(BadVersionError):  # the failed write did not count as a version
        await store.set("/a", b"x", version=1)
    disk.full = False
    assert (await store.set("/a", b"3", version=0)).version == 1
    await server.close()
    reopened = InProcessZooKeeper(tmp_path / "metadata.db")
    await reopened.open()
    again = reopened.session()
    await again.start()
    assert (await again.get("/a"))[0] == b"3"
    await reopened.close()


async def test_topic_changes_the_store_cannot_keep_are_refused_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch)
    async with running_broker(tmp_path) as broker:
        await broker.admin.create_topic("kept", 1, 1, {})
        disk.full = True
        with pytest.raises(KafkaError) as created:
            await broker.admin.create_topic("new", 1, 1, {})
        assert created.value.code == ErrorCode.kafka_storage_error
        with pytest.raises(KafkaError) as altered:
            await broker.admin.alter_configs("kept", {"retention.ms": "1000"}, False)
        assert altered.value.code == ErrorCode.kafka_storage_error
        with pytest.raises(KafkaError) as producer_ids:
            await broker.admin.next_producer_id()
        assert producer_ids.value.code == ErrorCode.coordinator_not_available
        assert "new" not in broker.cache.topics
        assert broker.cache.configs["kept"] == {}
        disk.full = False
        first = await broker.admin.next_producer_id()
    async with running_broker(tmp_path) as restarted:
        assert "new" not in restarted.cache.topics
        assert "kept" in restarted.cache.topics
        assert await restarted.admin.next_producer_id() > first  # ids never repeat
