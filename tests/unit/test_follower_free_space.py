"""A follower whose log dir is below `log.dir.min.free.bytes` does not append what its
leader sent: the partition is fetched again after the backoff, and appended once space
is freed, instead of filling the disk until an ENOSPC takes the dir offline."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.replicas import create_log
from tests.unit.test_write_failures import batch
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.network.broker_client import BrokerClient
from tierbroker.broker.replication.partition import Partition
from tierbroker.broker.replication.replica_fetcher import FetcherConfig, ReplicaFetcher, _FetchState
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage import free_space
from tierbroker.storage.free_space import FreeSpaceGuard
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("f", 0)
LEADER_ID, FOLLOWER_ID = 0, 1


def fetched(records: bytes) -> SimpleNamespace:
    """One partition of a Fetch answer: `records` from offset 0, no divergence."""
    return SimpleNamespace(
        error_code=ErrorCode.none,
        diverging_epoch=SimpleNamespace(epoch=-1, end_offset=-1),
        records=records,
        high_watermark=3,
        log_start_offset=0,
    )


def test_a_follower_below_the_floor_fetches_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = {"bytes": 0, "now_s": 0.0}
    monkeypatch.setattr(
        free_space,
        "os",
        SimpleNamespace(
            statvfs=lambda path: SimpleNamespace(
                f_frsize=1, f_blocks=1 << 40, f_bavail=free["bytes"]
            )
        ),
    )
    monkeypatch.setattr(free_space, "time", SimpleNamespace(monotonic=lambda: free["now_s"]))
    manager = LogManager([tmp_path / "logs"])
    manager.load_logs(lambda tp, topic_id: LogConfig())
    partition = Partition(create_log(manager, TP, uuid.uuid4(), LogConfig()), FOLLOWER_ID)
    partition.make_follower(PartitionState(LEADER_ID, 0, (LEADER_ID, FOLLOWER_ID), 1), (0, 1))
    fetcher = ReplicaFetcher(
        FOLLOWER_ID,
        lambda: 1,
        LEADER_ID,
        BrokerClient("127.0.0.1", 1, "test"),
        FetcherConfig(),
        lambda partitions: None,
        {},
        lambda partition, error: True,
        free_space=FreeSpaceGuard(1 << 20),
    )
    fetcher.partitions[TP] = state = _FetchState(partition, 0)
    records = bytes(batch(0))

    assert not asyncio.run(fetcher._process_partition(state, fetched(records)))
    assert partition.log.log_end_offset == 0
    assert state.delayed_until > time.monotonic()  # fetched again after the backoff

    free["bytes"], free["now_s"] = 2 << 20, 60.0  # space freed; the guard reads it again
    assert asyncio.run(fetcher._process_partition(state, fetched(records)))
    assert partition.log.log_end_offset == 3
