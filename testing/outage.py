"""`PausableRemoteStorageManager`: any remote storage plugin, with an outage on demand.

It wraps the plugin named by `rsm.config.pausable.delegate` (`localfs`, `s3` or a dotted
class path, as `remote.log.storage.manager.class.name` takes) and hands it every other
`rsm.config.*` setting. While its gate (`rsm.config.pausable.gate`, a name shared by the
brokers of one cluster) is paused, every call fails at once with a retriable
`RemoteStorageError`, as calls to an object store that does not answer fail: copies back
off and retry, remote reads fail, the store's health turns unhealthy, and produce and
local reads go on. Calls in flight when the pause starts finish. Resuming lets the next
call through.

Gates live in this process (`gate(name)`); the brokers of an in-process cluster share one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from tierbroker.broker.server.remote_storage import storage_manager_named
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition
from tierbroker.storage.remote.storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteStorageError,
    RemoteStorageManager,
)

DELEGATE = "pausable.delegate"
GATE = "pausable.gate"
CLASS_NAME = f"{__name__}.PausableRemoteStorageManager"


class OutageGate:
    """Open or paused; safe to flip from any thread."""

    def __init__(self) -> None:
        self._paused = threading.Event()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def check(self) -> None:
        if self._paused.is_set():
            raise RemoteStorageError("remote storage unavailable: the object store is paused")


_gates: dict[str, OutageGate] = {}
_gates_lock = threading.Lock()


def gate(name: str) -> OutageGate:
    """The gate of that name, made on first use."""
    with _gates_lock:
        return _gates.setdefault(name, OutageGate())


def drop_gate(name: str) -> None:
    with _gates_lock:
        _gates.pop(name, None)


class PausableRemoteStorageManager(RemoteStorageManager):
    def __init__(self) -> None:
        super().__init__()
        self.delegate: RemoteStorageManager | None = None
        self.gate = OutageGate()

    def configure(self, configs: Mapping[str, str]) -> None:
        name = configs.get(DELEGATE, "localfs")
        delegate = storage_manager_named(name, f"rsm.config.{DELEGATE}")()
        delegate.configure({k: v for k, v in configs.items() if k not in (DELEGATE, GATE)})
        self.delegate = delegate
        self.meter = delegate.meter  # the requests are the delegate's
        if GATE in configs:
            self.gate = gate(configs[GATE])

    @property
    def _rsm(self) -> RemoteStorageManager:
        assert self.delegate is not None, "configure() first"
        self.gate.check()
        return self.delegate

    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes | None:
        return await self._rsm.copy_log_segment_data(metadata, data)

    async def fetch_log_segment(
        self,
        metadata: RemoteLogSegmentMetadata,
        start_position: int,
        end_position: int | None = None,
    ) -> bytes:
        return await self._rsm.fetch_log_segment(metadata, start_position, end_position)

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        return await self._rsm.fetch_index(metadata, index_type)

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        await self._rsm.delete_log_segment_data(metadata)

    async def write_partition_index(self, tip: TopicIdPartition, document: bytes) -> bool:
        return await self._rsm.write_partition_index(tip, document)

    async def delete_partition_index(self, tip: TopicIdPartition) -> None:
        await self._rsm.delete_partition_index(tip)

    async def check(self, timeout_s: float) -> bool:
        return await self._rsm.check(timeout_s)

    async def start(self) -> None:
        assert self.delegate is not None, "configure() first"
        await self.delegate.start()

    async def close(self) -> None:
        if self.delegate is not None:
            await self.delegate.close()
