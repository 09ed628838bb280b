"""A follower that becomes a replica of another partition led here (a reassignment) asks for
it at its next fetch: its parked fetch is answered at once, and so are its fetches that
leave the new partition out, until one asks for it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.unit.replicas import replica_manager
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.replication.replica_manager import (
    FetchParams,
    FetchRequestPartition,
    ReplicaManager,
)
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

FOLLOWER = 1
OLD, NEW = TopicPartition("old", 0), TopicPartition("new", 0)
LONG_POLL_MS = 60_000  # a fetch not answered early would outlive the test


async def led_here(tmp_path: Path) -> ReplicaManager:
    """This broker leads OLD with FOLLOWER as a replica, and NEW alone."""
    replicas = replica_manager(LogManager([tmp_path]))
    for tp, members in ((OLD, (0, FOLLOWER)), (NEW, (0,))):
        await replicas.log_manager.create_logs([tp], uuid.uuid4(), LogConfig(), 0)
        replicas._become(tp, PartitionState(0, 0, members, 1, 0), members)
    return replicas


async def follower_fetch(replicas: ReplicaManager, *tps: TopicPartition) -> None:
    params = FetchParams(
        max_wait_ms=LONG_POLL_MS, min_bytes=1, max_bytes=1 << 20, replica_id=FOLLOWER
    )
    await replicas.fetch_messages(params, [FetchRequestPartition(tp, 0, 1 << 20) for tp in tps])


def add_follower_to_new(replicas: ReplicaManager) -> None:
    """The reassignment's metadata: NEW gets FOLLOWER as a replica, in a new leader epoch."""
    members = (0, FOLLOWER)
    replicas._become(NEW, PartitionState(0, 1, (0,), 1, 1), members)


async def test_a_parked_fetch_is_answered_when_the_follower_gains_a_partition(
    tmp_path: Path,
) -> None:
    replicas = await led_here(tmp_path)
    parked = asyncio.create_task(follower_fetch(replicas, OLD))
    await asyncio.sleep(0.05)
    assert not parked.done()  # nothing to read: it waits
    add_follower_to_new(replicas)
    async with asyncio.timeout(10):
        await parked


async def test_fetches_leaving_the_new_partition_out_are_answered_until_one_asks_for_it(
    tmp_path: Path,
) -> None:
    replicas = await led_here(tmp_path)
    add_follower_to_new(replicas)
    # The follower has not applied the metadata yet: its fetches leave NEW out.
    for _ in range(3):
        async with asyncio.timeout(10):
            await follower_fetch(replicas, OLD)
    # Once it asks for NEW, it long-polls again, with NEW or without it.
    for tps in ((OLD, NEW), (OLD,)):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await follower_fetch(replicas, *tps)
