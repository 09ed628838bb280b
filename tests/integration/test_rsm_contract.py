"""The RemoteStorageManager contract, run against LocalFs and against S3 on moto's server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.records import build_batch
from storage.log import Log
from storage.log_config import LogConfig
from storage.remote.key_layout import MANIFEST_SUFFIX, ObjectKeyLayout
from storage.remote.local_fs import LocalFsRemoteStorageManager
from storage.remote.s3 import S3RemoteStorageManager
from storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
)
from storage.remote.storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageManager,
)
from storage.topic_partition import TopicPartition
from tests.integration.moto_server import MotoServer

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("contract", 0))


@pytest.fixture(params=["localfs", "s3"])
def rsm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RemoteStorageManager]:
    if request.param == "localfs":
        plugin: RemoteStorageManager = LocalFsRemoteStorageManager()
        plugin.configure({"dir": str(tmp_path / "remote"), "cluster.id": "c1"})
        yield plugin
        return
    server = MotoServer().start()
    try:
        server.create_bucket("contract-bucket")
        plugin = S3RemoteStorageManager()
        plugin.configure(
            {
                "storage.s3.bucket.name": "contract-bucket",
                "storage.s3.region": "us-east-1",
                "storage.s3.endpoint.url": server.endpoint,
                "storage.s3.path.style.access.enabled": "true",
                "storage.aws.access.key.id": "testing",
                "storage.aws.secret.access.key": "testing",
                "storage.s3.multipart.upload.part.size": str(5 * 1024 * 1024),
                "cluster.id": "c1",
            }
        )
        yield plugin
        asyncio.run(plugin.close())
    finally:
        server.stop()


def rolled_segment(
    tmp_path: Path, size_bytes: int
) -> tuple[Log, LogSegmentData, RemoteLogSegmentMetadata]:
    log = Log(
        tmp_path / "log" / "contract-0",
        TIP.topic_partition,
        LogConfig(segment_bytes=size_bytes * 2),
        TIP.topic_id,
    )
    value = bytes(range(256)) * 40
    offset = 0
    while log.active_segment.size < size_bytes:
        log.append_as_leader(bytearray(build_batch([(b"k", value, [], 1000 + offset)] * 10)), 0)
        offset += 10
    segment = log.roll()
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(TIP),
        start_offset=segment.base_offset,
        end_offset=segment.next_offset - 1,
        max_timestamp_ms=segment.max_timestamp,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_bytes=segment.size,
        segment_leader_epochs=((0, 0),),
    )
    data = LogSegmentData(
        segment.log_path,
        segment.offset_index.path,
        segment.time_index.path,
        None,
        None,
        b"0\n1\n0 0\n",
    )
    return log, data, metadata


@pytest.mark.parametrize("size_bytes", [200_000, 12 * 1024 * 1024])
def test_copy_fetch_delete(rsm: RemoteStorageManager, tmp_path: Path, size_bytes: int) -> None:
    log, data, metadata = rolled_segment(tmp_path, size_bytes)
    content = data.log_segment.read_bytes()

    async def run() -> None:
        await rsm.copy_log_segment_data(metadata, data)
        assert await rsm.fetch_log_segment(metadata, 0) == content
        assert await rsm.fetch_log_segment(metadata, 100, 5_099) == content[100:5_100]
        assert await rsm.fetch_log_segment(metadata, len(content) - 10) == content[-10:]
        assert await rsm.fetch_index(metadata, IndexType.OFFSET) == data.offset_index.read_bytes()
        assert await rsm.fetch_index(metadata, IndexType.TIMESTAMP) == data.time_index.read_bytes()
        assert await rsm.fetch_index(metadata, IndexType.LEADER_EPOCH) == b"0\n1\n0 0\n"
        await rsm.delete_log_segment_data(metadata)
        await rsm.delete_log_segment_data(metadata)  # deleting again succeeds
        with pytest.raises(RemoteResourceNotFoundError):
            await rsm.fetch_log_segment(metadata, 0)

    try:
        asyncio.run(run())
    finally:
        log.close()


def test_manifest_is_written_last_and_lists_every_object(tmp_path: Path) -> None:
    plugin = LocalFsRemoteStorageManager()
    plugin.configure({"dir": str(tmp_path / "remote"), "cluster.id": "c1"})
    log, data, metadata = rolled_segment(tmp_path, 100_000)
    asyncio.run(plugin.copy_log_segment_data(metadata, data))
    layout = ObjectKeyLayout(cluster="c1")
    manifest = tmp_path / "remote" / layout.segment_key(metadata, MANIFEST_SUFFIX)
    others = [tmp_path / "remote" / k for k in layout.all_keys(metadata)[:-1]]
    existing = [p for p in others if p.exists()]
    assert existing and all(p.stat().st_mtime_ns <= manifest.stat().st_mtime_ns for p in existing)
    import json

    document = json.loads(manifest.read_text())
    assert document["segment"]["end_offset"] == metadata.end_offset
    assert document["objects"]["log"]["size"] == data.log_segment.stat().st_size
    log.close()


def test_entropy_spreads_partitions_over_prefixes() -> None:
    layout = ObjectKeyLayout(entropy_bits=4, cluster="c1")
    prefixes = {
        layout.partition_prefix(TopicIdPartition(TIP.topic_id, TopicPartition("t", p))).split("/")[
            0
        ]
        for p in range(64)
    }
    assert len(prefixes) > 8 and all(len(p) == 1 for p in prefixes)
    assert layout.partition_prefix(TIP) == ObjectKeyLayout(
        entropy_bits=4, cluster="c1"
    ).partition_prefix(TIP)
