"""The remote store's health: the start check (LocalFs's, a plugin's that hangs, a plugin
without one), what it logs, and how copies and reads keep it true afterwards."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.unit import virtual_time
from tests.unit.test_remote_metadata import MemoryTopic
from tests.unit.test_rlm_components import (
    LINEAGE,
    TIP,
    PartialCopyThenFail,
    build_log,
    copy_task,
    tiered_reader,
)
from tierbroker.protocol.errors import KafkaError
from tierbroker.rlm.remote_reader import RemoteLogReader
from tierbroker.rlm.storage_health import HealthState, RemoteStorageHealth
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.remote.chunk_cache import ChunkCache, ChunkCacheConfig, MemoryChunkStore
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata
from tierbroker.storage.remote.storage_manager import RemoteStorageError, RemoteStorageManager
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager


def local_fs(root: Path) -> LocalFsRemoteStorageManager:
    rsm = LocalFsRemoteStorageManager()
    rsm.configure({"dir": str(root)})
    return rsm


def gauge(health: RemoteStorageHealth) -> float:
    """The value `RemoteStorageHealthy` shows."""
    [metric] = health.gauge.collect()
    [sample] = metric.samples
    return sample.value


# LocalFs's check ----------------------------------------------------------------------


async def test_the_local_fs_check_creates_the_dir_and_leaves_nothing_in_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "not" / "yet" / "remote"
    rsm = local_fs(root)
    assert not root.exists()  # configuring touches no disk
    assert await rsm.check(5) is True
    assert root.is_dir() and list(root.iterdir()) == []


async def test_the_local_fs_check_names_the_dir_and_the_property_when_it_cannot_write(
    tmp_path: Path,
) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    root = tmp_path / "a-file" / "remote"  # cannot be a directory, even for root
    with pytest.raises(RemoteStorageError) as failure:
        await local_fs(root).check(5)
    message = str(failure.value)
    assert str(root) in message and "rsm.config.dir" in message
    assert "\n" not in message and not failure.value.retriable


# The start check ---------------------------------------------------------------------


async def test_a_failed_start_check_is_one_warning_naming_what_to_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    health = RemoteStorageHealth(CollectorRegistry())
    assert (health.state, gauge(health)) == (HealthState.NOT_CHECKED, -1)
    with caplog.at_level(logging.DEBUG, logger="tierbroker"):
        await health.check(local_fs(tmp_path / "a-file" / "remote"))
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage().startswith("remote storage check failed: remote dir ")
    assert "rsm.config.dir" in record.getMessage()
    assert (health.state, gauge(health)) == (HealthState.UNHEALTHY, 0)
    assert health.as_dict()["error"] in record.getMessage()


async def test_a_passed_start_check_makes_it_healthy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    health = RemoteStorageHealth(CollectorRegistry())
    with caplog.at_level(logging.INFO, logger="tierbroker"):
        await health.check(local_fs(tmp_path / "remote"))
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert (health.state, gauge(health)) == (HealthState.HEALTHY, 1)
    assert health.as_dict()["error"] is None


class NoCheck(RemoteStorageManager):
    """A user's plugin written before `check()`: only the abstract methods."""

    def configure(self, configs: object) -> None:
        pass

    async def copy_log_segment_data(self, metadata: object, data: object) -> None:
        pass

    async def fetch_log_segment(
        self, metadata: object, start_position: int, end_position: int | None = None
    ) -> bytes:
        return b""

    async def fetch_index(self, metadata: object, index_type: object) -> bytes:
        return b""

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        pass


async def test_a_plugin_without_a_check_is_not_checked() -> None:
    health = RemoteStorageHealth(CollectorRegistry())
    await health.check(NoCheck())
    assert health.as_dict()["state"] == "not checked" and gauge(health) == -1


class Hangs(NoCheck):
    async def check(self, timeout_s: float) -> bool:
        await asyncio.Event().wait()
        return True


def test_a_check_that_hangs_is_given_up_and_the_start_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = RemoteStorageHealth(CollectorRegistry())

    async def check() -> float:
        await health.check(Hangs(), timeout_s=5)
        return asyncio.get_running_loop().time()

    with caplog.at_level(logging.WARNING, logger="tierbroker"):
        given_up_at = virtual_time.run(check())
    assert given_up_at == pytest.approx(6.0)  # its own bound, and a second of grace
    assert health.state is HealthState.UNHEALTHY
    assert caplog.messages == [
        "remote storage check failed: Hangs.check() did not finish in 5s "
        "(the local tier serves on; copies retry)"
    ]


# Kept true by copies and reads -------------------------------------------------------


async def test_copies_keep_the_health_true(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lg = build_log(tmp_path / "t-0")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    rsm = PartialCopyThenFail()
    rsm.configure({"dir": str(tmp_path / "remote")})
    task = copy_task(TieredPartition(TIP, lg), rsm, rlmm)
    health = task.metrics.health
    await health.check(rsm)
    assert health.state is HealthState.HEALTHY
    with pytest.raises(RemoteStorageError):
        await task.run_once()
    assert health.as_dict()["error"] == "injected: connection reset mid-copy"
    assert (health.state, gauge(health)) == (HealthState.UNHEALTHY, 0)
    rsm.fail = False
    with caplog.at_level(logging.INFO, logger="tierbroker.rlm.storage_health"):
        await task.run_once()
    assert (health.state, gauge(health)) == (HealthState.HEALTHY, 1)
    assert caplog.messages == [
        "remote storage works again (it failed with: injected: connection reset mid-copy)"
    ]
    lg.close()


class Unreadable(LocalFsRemoteStorageManager):
    async def fetch_log_segment(
        self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None
    ) -> bytes:
        raise RemoteStorageError("injected: read refused")


async def test_remote_reads_keep_the_health_true_and_other_errors_leave_it(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    reader, copied = await tiered_reader(tmp_path, lg, local_fs(tmp_path / "remote"))
    health = reader.metrics.health
    await reader.read(TIP, 0, 5000, 5, LINEAGE)
    assert health.state is HealthState.HEALTHY
    with pytest.raises(KafkaError):  # not in the remote tier: not the store's failure
        await reader.read(TIP, copied[-1].end_offset + 1, 5000, 5, LINEAGE)
    assert health.state is HealthState.HEALTHY
    unreadable = Unreadable()
    unreadable.configure({"dir": str(tmp_path / "remote")})
    chunks = ChunkCache(ChunkCacheConfig(), MemoryChunkStore(), fetch_slots=2, fetch_timeout_s=5)
    refusing = RemoteLogReader(
        reader.config, reader.rlmm, unreadable, reader.index_cache, chunks, reader.metrics
    )
    with pytest.raises(RemoteStorageError):
        await refusing.read(TIP, 0, 5000, 5, LINEAGE)
    assert health.as_dict()["error"] == "injected: read refused"
    await reader.read(TIP, copied[-1].start_offset + 1, 5000, 5, LINEAGE)  # not in the cache
    assert health.state is HealthState.HEALTHY
    await reader.close()
    lg.close()
