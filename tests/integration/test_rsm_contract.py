"""The RemoteStorageManager contract, run against LocalFs (a temp dir) and S3 (moto's server).

A real segment is built with `storage.log.Log` and copied; then reads of the whole
segment and of ranges, every index, the manifest (lists every object with its
size, written last), deletes (idempotent), missing segments, failed copies (leave
nothing) and the key prefix entropy are checked the same way for both plugins.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import crc32c
import pytest

from tests.integration.moto_server import (
    InstrumentedS3,
    moto_endpoint,  # noqa: F401 (a fixture)
    rsm_configs,
)
from tierbroker.protocol.records import build_batch
from tierbroker.protocol.records.builder import RecordInput
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.remote.index_bundle import pack_indexes
from tierbroker.storage.remote.key_layout import (
    INDEXES_SUFFIX,
    LOG_SUFFIX,
    MANIFEST_SUFFIX,
    ObjectKeyLayout,
)
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager
from tierbroker.storage.remote.request_meter import RequestKind, Transfer
from tierbroker.storage.remote.segment_codec import (
    AS_WRITTEN_TAG,
    CHUNKED_TAG,
    SegmentDecodeError,
)
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
)
from tierbroker.storage.topic_partition import TopicPartition

CLUSTER = "c1"
TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("contract", 0))
EPOCHS = b"0\n1\n0 0\n"


def rolled_segment(
    directory: Path, size_bytes: int, tip: TopicIdPartition = TIP
) -> tuple[Log, LogSegmentData, RemoteLogSegmentMetadata]:
    """A log with one rolled segment of about `size_bytes`: its files and its metadata."""
    log = Log(
        directory / f"{tip.topic_partition.topic}-{tip.topic_partition.partition}",
        tip.topic_partition,
        LogConfig(segment_bytes=size_bytes * 2),
        tip.topic_id,
    )
    value = os.urandom(4000)  # incompressible, different in every segment
    offset = 0
    while log.active_segment.size < size_bytes:
        records: list[RecordInput] = [
            (b"k%d" % (offset + i), value, [], 1_000 + offset + i) for i in range(10)
        ]
        batch = build_batch(records, producer_id=7, producer_epoch=0, base_sequence=offset)
        log.append_as_leader(bytearray(batch), 0)
        offset += 10
    segment = log.roll()
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(tip),
        start_offset=segment.base_offset,
        end_offset=segment.next_offset - 1,
        max_timestamp_ms=segment.max_timestamp,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_bytes=segment.size,
        segment_leader_epochs=((0, 0),),
    )
    snapshot = log.producer_state.snapshot_path(segment.next_offset)
    data = LogSegmentData(
        log_segment=segment.log_path,
        offset_index=segment.offset_index.path,
        time_index=segment.time_index.path,
        transaction_index=None,
        producer_snapshot_index=snapshot if snapshot.exists() else None,
        leader_epoch_index=EPOCHS,
    )
    return log, data, metadata


@dataclass
class Backend:
    """A plugin under test and a look at its storage from outside."""

    kind: str
    make: Callable[[dict[str, str]], Awaitable[RemoteStorageManager]]
    objects: Callable[[], Awaitable[dict[str, int]]]  # every stored key and its size
    read: Callable[[str], Awaitable[bytes]]
    written_last: Callable[[str], Awaitable[bool]]  # was this key written after all others?
    remove: Callable[[str], Awaitable[None]]  # delete one object behind the plugin's back


@pytest.fixture(params=["localfs", "s3"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    plugins: list[RemoteStorageManager] = []
    if request.param == "localfs":
        root = tmp_path / "remote"

        async def make_localfs(extra: dict[str, str]) -> RemoteStorageManager:
            plugin = LocalFsRemoteStorageManager()
            plugin.configure({"dir": str(root), "cluster.id": CLUSTER, **extra})
            plugins.append(plugin)
            return plugin

        async def local_objects() -> dict[str, int]:
            return {
                p.relative_to(root).as_posix(): p.stat().st_size
                for p in root.rglob("*")
                if p.is_file()
            }

        async def local_read(key: str) -> bytes:
            return (root / key).read_bytes()

        async def local_written_last(key: str) -> bool:
            mtimes = {k: (root / k).stat().st_mtime_ns for k in await local_objects()}
            return all(mtime <= mtimes[key] for mtime in mtimes.values())

        async def local_remove(key: str) -> None:
            (root / key).unlink()

        backend = Backend(
            "localfs", make_localfs, local_objects, local_read, local_written_last, local_remove
        )
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = f"contract-{uuid.uuid4().hex[:12]}"
        s3_plugins: list[InstrumentedS3] = []

        async def make_s3(extra: dict[str, str]) -> RemoteStorageManager:
            plugin = InstrumentedS3()
            plugin.configure(rsm_configs(endpoint, bucket, **{"cluster.id": CLUSTER, **extra}))
            if not s3_plugins:
                await (await plugin.raw()).create_bucket(Bucket=bucket)
            plugins.append(plugin)
            s3_plugins.append(plugin)
            return plugin

        async def s3_client() -> Any:
            if not s3_plugins:
                await make_s3({})
            return await s3_plugins[0].raw()

        async def s3_objects() -> dict[str, int]:
            client = await s3_client()
            found: dict[str, int] = {}
            async for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                found.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
            return found

        async def s3_read(key: str) -> bytes:
            response = await (await s3_client()).get_object(Bucket=bucket, Key=key)
            async with response["Body"] as body:
                data: bytes = await body.read()
                return data

        async def s3_written_last(key: str) -> bool:
            written = [k for p in s3_plugins if p.faulty for k in p.faulty.written()]
            stored = set(await s3_objects())
            return bool(written) and written[-1] == key and stored <= set(written)

        async def s3_remove(key: str) -> None:
            await (await s3_client()).delete_object(Bucket=bucket, Key=key)

        backend = Backend("s3", make_s3, s3_objects, s3_read, s3_written_last, s3_remove)
    try:
        yield backend
    finally:
        for plugin in plugins:
            await plugin.close()


@pytest.fixture(scope="module")
def segment(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[LogSegmentData, RemoteLogSegmentMetadata]:
    """One real rolled segment for the module (the tests only read its files)."""
    log, data, metadata = rolled_segment(tmp_path_factory.mktemp("log"), 300_000)
    log.close()
    return data, metadata


def expected_indexes(data: LogSegmentData) -> dict[IndexType, bytes]:
    return {
        t: source if isinstance(source, bytes) else source.read_bytes()
        for t, source in data.indexes().items()
    }


def key_configs(directory: Path, *key_ids: str, active: str | None = None) -> dict[str, str]:
    """Settings naming key files (made here, random) for `key_ids`, encrypting with `active`."""
    configs = {"encryption.keys": ",".join(key_ids)}
    for key_id in key_ids:
        path = directory / f"{key_id}.key"
        if not path.exists():
            path.write_bytes(os.urandom(32))
        configs[f"encryption.keys.{key_id}.file"] = str(path)
    if active is not None:
        configs |= {"encryption.enabled": "true", "encryption.key.id": active}
    return configs


TRANSFORMS = {
    "as written": {},
    "compressed": {"compression.enabled": "true", "chunk.size": "65536"},
    "encrypted": {"chunk.size": "65536"},
    "compressed and encrypted": {"compression.enabled": "true", "chunk.size": "100000"},
}


@pytest.mark.parametrize("transform", TRANSFORMS)
async def test_copy_then_fetch_the_whole_segment_ranges_and_indexes(
    backend: Backend,
    segment: tuple[LogSegmentData, RemoteLogSegmentMetadata],
    tmp_path: Path,
    transform: str,
) -> None:
    data, metadata = segment
    content = data.log_segment.read_bytes()
    assert data.producer_snapshot_index is not None  # every index the copy task sends but txn
    configs = dict(TRANSFORMS[transform])
    if "encrypted" in transform:
        configs |= key_configs(tmp_path, "k1", active="k1")
    copier = await backend.make(configs)
    custom = await copier.copy_log_segment_data(metadata, data)
    assert custom == (AS_WRITTEN_TAG if transform == "as written" else CHUNKED_TAG)
    if transform != "as written":
        stored = await backend.read(
            ObjectKeyLayout(cluster=CLUSTER).segment_key(metadata, LOG_SUFFIX)
        )
        assert content[:4000] not in stored  # each chunk compressed or encrypted
    # A plugin that did not copy it reads its manifest first.
    for rsm in (copier, await backend.make(configs)):
        await check_reads(rsm, data, metadata, content)
    if transform == "as written":  # its custom metadata says so: no manifest is needed
        await backend.remove(
            ObjectKeyLayout(cluster=CLUSTER).segment_key(metadata, MANIFEST_SUFFIX)
        )
        tagged = replace(metadata, custom_metadata=custom)
        await check_reads(await backend.make(configs), data, tagged, content)
        with pytest.raises(RemoteResourceNotFoundError):  # untagged, its manifest is asked for
            await (await backend.make(configs)).fetch_log_segment(metadata, 0)


async def check_reads(
    rsm: RemoteStorageManager,
    data: LogSegmentData,
    metadata: RemoteLogSegmentMetadata,
    content: bytes,
) -> None:
    size = len(content)
    assert await rsm.fetch_log_segment(metadata, 0) == content
    ranges = [(0, 0), (0, size - 1), (100, 5_099), (size - 10, None), (size - 1, size - 1)]
    for start, end in ranges:
        stop = size if end is None else end + 1
        assert await rsm.fetch_log_segment(metadata, start, end) == content[start:stop]
    assert await rsm.fetch_log_segment(metadata, 5, size + 1_000) == content[5:]  # clipped
    assert await rsm.fetch_log_segment(metadata, size) == b""  # at the end: nothing
    assert await rsm.fetch_log_segment(metadata, size + 10, size + 20) == b""
    assert await rsm.fetch_log_segment(metadata, 10, 9) == b""  # empty range

    for index_type, expected in expected_indexes(data).items():
        assert await rsm.fetch_index(metadata, index_type) == expected, index_type
    with pytest.raises(RemoteResourceNotFoundError):
        await rsm.fetch_index(metadata, IndexType.TRANSACTION)  # not copied: none was given


async def test_a_missing_or_wrong_key_fails_the_read_and_says_which(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata], tmp_path: Path
) -> None:
    data, metadata = segment
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    copier = await backend.make(key_configs(tmp_path, "k1", active="k1"))
    await copier.copy_log_segment_data(metadata, data)
    # A second key made active later: the segment is still read with the key it names.
    rotation = await backend.make(key_configs(tmp_path, "k1", "k2", active="k2"))
    assert await rotation.fetch_log_segment(metadata, 0) == data.log_segment.read_bytes()
    without = await backend.make(key_configs(tmp_path, "k2"))
    with pytest.raises(
        SegmentDecodeError, match="encrypted with key 'k1', which is not configured"
    ):
        await without.fetch_log_segment(metadata, 0)
    wrong = await backend.make(key_configs(rotated, "k1"))  # other bytes under the same id
    with pytest.raises(SegmentDecodeError, match="key 'k1' does not open its data key"):
        await wrong.fetch_index(metadata, IndexType.OFFSET)


async def test_manifest_lists_every_object_with_its_size_and_is_written_last(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata]
) -> None:
    data, metadata = segment
    rsm = await backend.make({})
    await rsm.copy_log_segment_data(metadata, data)

    layout = ObjectKeyLayout(cluster=CLUSTER)
    manifest_key = layout.segment_key(metadata, MANIFEST_SUFFIX)
    stored = await backend.objects()
    assert manifest_key in stored
    document = json.loads(await backend.read(manifest_key))
    assert document["version"] == 3
    assert RemoteLogSegmentMetadata.from_json(document["segment"]) == metadata
    log_bytes = data.log_segment.read_bytes()
    indexes = pack_indexes(expected_indexes(data))
    assert document["objects"] == {
        suffix: {
            "key": layout.segment_key(metadata, suffix),
            "size": len(content),
            "crc32c": crc32c.crc32c(content),
        }
        for suffix, content in {LOG_SUFFIX: log_bytes, INDEXES_SUFFIX: indexes}.items()
    }
    # Exactly the objects the manifest names, plus the manifest, with the sizes it says.
    assert stored == {o["key"]: o["size"] for o in document["objects"].values()} | {
        manifest_key: stored[manifest_key]
    }
    assert await backend.written_last(manifest_key)


async def test_the_meter_counts_each_request_and_its_bytes_by_topic(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata]
) -> None:
    data, metadata = segment
    rsm = await backend.make({})
    await rsm.copy_log_segment_data(metadata, data)
    stored = await backend.objects()
    copied = rsm.meter.usage()
    assert copied.keys() == {TIP.topic_partition.topic}
    # A segment of one part: log, indexes and manifest, a PUT each.
    assert copied[TIP.topic_partition.topic].requests == {RequestKind.PUT: 3}
    assert copied[TIP.topic_partition.topic].bytes == {Transfer.UPLOAD: sum(stored.values())}

    first = await rsm.fetch_log_segment(metadata, 100, 4099)
    whole = await rsm.fetch_log_segment(metadata, 0)
    usage = rsm.meter.usage()[TIP.topic_partition.topic]
    assert usage.requests == {RequestKind.PUT: 3, RequestKind.GET: 2}
    assert usage.bytes[Transfer.DOWNLOAD] == len(first) + len(whole) == 4000 + len(whole)

    rsm.meter.forget(TIP.topic_partition.topic)
    assert rsm.meter.usage() == {}


async def test_copy_again_overwrites(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata]
) -> None:
    data, metadata = segment
    rsm = await backend.make({})
    await rsm.copy_log_segment_data(metadata, data)
    before = await backend.objects()
    await rsm.copy_log_segment_data(metadata, data)  # a retried copy
    assert await backend.objects() == before
    assert await rsm.fetch_log_segment(metadata, 0) == data.log_segment.read_bytes()


async def test_delete_removes_everything_and_deleting_again_succeeds(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata]
) -> None:
    data, metadata = segment
    rsm = await backend.make({})
    await rsm.copy_log_segment_data(metadata, data)
    assert len(await backend.objects()) == 3  # log, indexes, manifest

    await rsm.delete_log_segment_data(metadata)
    assert await backend.objects() == {}
    await rsm.delete_log_segment_data(metadata)
    with pytest.raises(RemoteResourceNotFoundError):
        await rsm.fetch_log_segment(metadata, 0)
    with pytest.raises(RemoteResourceNotFoundError):
        await rsm.fetch_index(metadata, IndexType.OFFSET)


async def test_a_segment_never_copied_is_not_found(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata]
) -> None:
    _, metadata = segment
    rsm = await backend.make({})
    with pytest.raises(RemoteResourceNotFoundError):
        await rsm.fetch_log_segment(metadata, 0, 100)
    for index_type in IndexType:
        with pytest.raises(RemoteResourceNotFoundError):
            await rsm.fetch_index(metadata, index_type)
    await rsm.delete_log_segment_data(metadata)  # deleting what is not there succeeds


async def test_a_failed_copy_leaves_nothing_behind(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata], tmp_path: Path
) -> None:
    data, metadata = segment
    rsm = await backend.make({})
    # The time index is gone (deleted under the copy): the indexes object cannot be made.
    broken = LogSegmentData(
        data.log_segment,
        data.offset_index,
        tmp_path / "gone.timeindex",
        None,
        data.producer_snapshot_index,
        EPOCHS,
    )
    with pytest.raises((RemoteStorageError, OSError)):
        await rsm.copy_log_segment_data(metadata, broken)
    assert await backend.objects() == {}


async def test_entropy_spreads_partitions_over_prefixes_deterministically(
    backend: Backend, segment: tuple[LogSegmentData, RemoteLogSegmentMetadata]
) -> None:
    data, template = segment
    configs = {"key.prefix": "tiered/", "key.prefix.entropy.bits": "4"}
    rsm = await backend.make(configs)
    tips = [
        TopicIdPartition(uuid.uuid4(), TopicPartition(topic, p))
        for topic in ("orders", "payments")
        for p in range(8)
    ]
    segments = {}
    for tip in tips:
        metadata = replace(template, segment_id=RemoteLogSegmentId.generate(tip))
        segments[tip] = metadata
        await rsm.copy_log_segment_data(metadata, data)

    # The first level under the prefix is the partition's entropy: 1 hex digit for 4 bits.
    layout = ObjectKeyLayout(prefix="tiered/", entropy_bits=4, cluster=CLUSTER)
    by_partition: dict[tuple[str, str], set[str]] = {}
    for key in await backend.objects():
        prefix, entropy, cluster, topic_dir, partition, _ = key.split("/")
        assert (prefix, cluster) == ("tiered", CLUSTER)
        assert len(entropy) == 1 and int(entropy, 16) < 16
        by_partition.setdefault((topic_dir, partition), set()).add(entropy)
    assert len(by_partition) == len(tips)
    assert all(len(e) == 1 for e in by_partition.values())  # one prefix per partition
    used = set().union(*by_partition.values())
    tps = [t.topic_partition for t in tips]
    assert used == {layout.entropy(tp.topic, tp.partition).rstrip("/") for tp in tps}
    assert len(used) >= 4  # 16 partitions over 16 prefixes

    # Deterministic: another plugin instance configured alike finds every segment.
    other = await backend.make(configs)
    for metadata in segments.values():
        assert await other.fetch_log_segment(metadata, 0, 99) == data.log_segment.read_bytes()[:100]
