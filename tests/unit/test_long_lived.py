"""Partition state is moved out of the collector's walks once led, which is only safe
because a deleted topic's state is freed by reference counting alone: no cycles."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

from tierbroker.broker.broker_server import BrokerServer
from tierbroker.broker.config import load_config
from tierbroker.broker.long_lived import FREEZE_EVERY_PARTITIONS
from tierbroker.broker.preflight import bind_ports
from tierbroker.storage.topic_partition import TopicPartition

TIERED = {"remote.storage.enable": "true", "segment.bytes": str(1 << 20)}


def tierbroker_objects() -> dict[int, object]:
    return {id(o): o for o in gc.get_objects() if type(o).__module__.startswith("tierbroker.")}


async def test_a_deleted_topic_is_freed_without_the_cyclic_collector(tmp_path: Path) -> None:
    config = load_config(
        None,
        [
            f"log.dirs={tmp_path / 'logs'}",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "metrics.port=-1",
            f"rsm.config.dir={tmp_path / 'remote'}",
        ],
    )
    server = BrokerServer(config, bind_ports(config))
    await server.start()
    try:
        gc.collect()
        before = tierbroker_objects()
        await server.controller.create_topic_batched("t", 3, 1, TIERED)
        created = [o for key, o in tierbroker_objects().items() if key not in before]
        del before
        kinds = {type(o).__name__ for o in created}
        assert {"Partition", "Log", "LogSegment", "CopyTask", "ExpirationTask"} <= kinds
        refs = []
        for o in created:
            try:
                refs.append(weakref.ref(o))
            except TypeError:
                pass  # slotted, without weak references: not checked
        del created, o
        assert TopicPartition("t", 0) in server.replicas.partitions
        gc.disable()
        server.controller.delete_topic("t")
        for _ in range(3):  # the loop drops its references to finished futures
            await asyncio.sleep(0)
        alive = [type(o).__name__ for r in refs if (o := r()) is not None]
        assert alive == []
    finally:
        gc.enable()
        await server.stop()


async def test_leading_partitions_freezes_them(tmp_path: Path) -> None:
    config = load_config(
        None,
        [f"log.dirs={tmp_path / 'logs'}", "listeners=PLAINTEXT://127.0.0.1:0", "metrics.port=-1"],
    )
    server = BrokerServer(config, bind_ports(config))
    await server.start()
    try:
        gc.unfreeze()
        await server.controller.create_topic_batched("t", FREEZE_EVERY_PARTITIONS, 1, {})
        frozen = gc.get_freeze_count()
        led = server.replicas.partitions[TopicPartition("t", FREEZE_EVERY_PARTITIONS - 1)]
        assert frozen > 0
        # the permanent generation is not in gc.get_objects(): a led partition is there
        assert not any(o is led for o in gc.get_objects())
    finally:
        await server.stop()
