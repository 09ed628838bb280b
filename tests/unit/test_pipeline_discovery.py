"""Segment discovery and reads over a remote dir written by `LocalFsRemoteStorageManager`.

Segments are built here byte for byte as the broker stores them (batches, a
sparse offset index of base offsets, a time index) and copied with the real
plugin, so discovery sees exactly the broker's object layout and manifests.
"""

from __future__ import annotations

import ast
import functools
import logging
import random
import struct
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition as KafkaTopicPartition

from tierbroker.pipeline.chunk_reader import ChunkReader
from tierbroker.pipeline.committed import CommittedView
from tierbroker.pipeline.discovery import (
    RemoteSegment,
    SegmentDiscovery,
    SegmentRange,
    resolve_overlaps,
)
from tierbroker.pipeline.remote_fetcher import RemoteFetcher
from tierbroker.pipeline.segments import (
    iter_batches_from,
    offset_for_timestamp,
    read_chunk,
    read_log,
    start_position,
)
from tierbroker.pipeline.storage import LocalObjectStore, ObjectNotFoundError, open_store
from tierbroker.protocol.records import Compression, build_batch
from tierbroker.storage.remote.chunk_cache import ChunkCache, ChunkCacheConfig, MemoryChunkStore
from tierbroker.storage.remote.key_layout import MANIFEST_SUFFIX
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import LogSegmentData
from tierbroker.storage.topic_partition import TopicPartition

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "events"
TOPIC_ID = uuid.UUID(int=0x1234)
CLUSTER = "c1"
BATCH = 10  # records per batch


def record_ts(offset: int) -> int:
    return 1_700_000_000_000 + offset * 10


def rsm_for(remote: Path, **configs: str) -> LocalFsRemoteStorageManager:
    rsm = LocalFsRemoteStorageManager()
    rsm.configure({"dir": str(remote), "cluster.id": CLUSTER, **configs})
    return rsm


async def copy_segment(
    rsm: LocalFsRemoteStorageManager,
    work: Path,
    partition: int,
    start: int,
    end: int,
    epoch: int = 0,
    codec: Compression = Compression.NONE,
    timestamp: Callable[[int], int] = record_ts,
) -> RemoteLogSegmentMetadata:
    """Write offsets start..end (inclusive) as one segment and copy it with the plugin."""
    log_bytes, index, time_index = bytearray(), bytearray(), bytearray()
    for base in range(start, end + 1, BATCH):
        last = min(base + BATCH - 1, end)
        records = [
            (b"k%d" % o, None if o % 7 == 0 else b"v%d" % o, [("h", b"%d" % o)], timestamp(o))
            for o in range(base, last + 1)
        ]
        index += struct.pack(">ii", base - start, len(log_bytes))
        time_index += struct.pack(">qi", timestamp(last), last - start)
        log_bytes += build_batch(
            records, base_offset=base, compression=codec, partition_leader_epoch=epoch
        )
    name = f"{partition}-{start}-{uuid.uuid4().hex[:6]}"
    files = {s: work / f"{name}.{s}" for s in ("log", "index", "timeindex")}
    files["log"].write_bytes(log_bytes)
    files["index"].write_bytes(index)
    files["timeindex"].write_bytes(time_index)
    tip = TopicIdPartition(TOPIC_ID, TopicPartition(TOPIC, partition))
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(tip),
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=timestamp(end),
        broker_id=0,
        event_timestamp_ms=1,
        segment_size_bytes=len(log_bytes),
        segment_leader_epochs=((epoch, start),),
    )
    data = LogSegmentData(files["log"], files["index"], files["timeindex"], None, None, b"")
    await rsm.copy_log_segment_data(metadata, data)
    return metadata


def segment(start: int, end: int, epoch: int, sid: str, *epochs: tuple[int, int]) -> RemoteSegment:
    """A segment of `epoch` from `start`, or of the (epoch, start) entries `epochs`."""
    leader_epochs = epochs or ((epoch, start),)
    return RemoteSegment(
        CLUSTER, TOPIC, 0, "id", sid, start, end, 0, leader_epochs, 0, 0, "k", None, "m"
    )


def spans(ranges: list) -> list[tuple[str, int, int]]:  # type: ignore[type-arg]
    return [(r.segment.segment_id, r.first_offset, r.last_offset) for r in ranges]


async def test_only_segments_with_a_manifest_are_found(tmp_path: Path) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    rsm = rsm_for(remote)
    first = await copy_segment(rsm, work, 0, 0, 99)
    second = await copy_segment(rsm, work, 0, 100, 199)
    await copy_segment(rsm, work, 1, 0, 49)
    # An upload in progress: data present, manifest not yet written.
    (remote / rsm.layout.segment_key(second, MANIFEST_SUFFIX)).unlink()
    (remote / "c1" / "stray.tmp").write_bytes(b"half-written")

    discovery = SegmentDiscovery(open_store(remote.as_uri()))
    assert discovery.clusters() == [CLUSTER]
    assert discovery.partitions(TOPIC) == [0, 1]
    assert discovery.partitions("other") == []
    found = discovery.segments(TOPIC, 0)
    assert [(s.start_offset, s.end_offset) for s in found] == [(0, 99)]
    assert found[0].segment_id == str(first.segment_id.id)
    assert found[0].size == first.segment_size_bytes
    assert spans(discovery.ranges(TOPIC, 1)) == [
        (discovery.segments(TOPIC, 1)[0].segment_id, 0, 49)
    ]


def test_overlaps_resolve_by_epoch_then_later_start_whatever_the_order() -> None:
    segments = [
        segment(0, 99, 0, "a"),
        segment(50, 149, 0, "b", (0, 50), (1, 100)),  # a new leader re-uploaded 50..99, went on
        segment(120, 199, 1, "c"),  # same epoch, starts later: wins 120..149
        segment(60, 70, 0, "d"),  # entirely under higher or equal priority: never read
        segment(300, 399, 1, "e"),  # after a gap
        segment(320, 329, 1, "f"),  # a retried copy inside, starting later: splits e in two
    ]
    expected = [
        ("a", 0, 49),
        ("b", 50, 119),
        ("c", 120, 199),
        ("e", 300, 319),
        ("f", 320, 329),
        ("e", 330, 399),
    ]
    for seed in range(5):
        random.Random(seed).shuffle(segments)
        assert spans(resolve_overlaps(segments)) == expected


def test_only_the_latest_lineage_is_read_and_a_diverged_segment_up_to_where_it_agrees() -> None:
    """Epoch 2's leader (deposed, unclean election) wrote 150..249 that epoch 3's never had:
    epoch 3's lineage is 0 from 0, 1 from 100, 3 from 150, read as the broker reads it."""
    segments = [
        segment(0, 99, 0, "a"),
        segment(100, 199, 1, "b", (1, 100), (2, 150)),  # epoch 2 from 150: diverged there
        segment(200, 249, 2, "c"),  # wholly of the dead lineage: never read
        segment(140, 219, 1, "d", (1, 140), (3, 150)),  # the new leader's: 3 follows 1 at 150
        segment(220, 299, 3, "e"),
    ]
    expected = [("a", 0, 99), ("b", 100, 139), ("d", 140, 219), ("e", 220, 299)]
    for seed in range(5):
        random.Random(seed).shuffle(segments)
        assert spans(resolve_overlaps(segments)) == expected


async def test_overlapping_uploads_in_the_store(tmp_path: Path) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    rsm = rsm_for(remote)
    old = await copy_segment(rsm, work, 0, 0, 99, epoch=0)
    new = await copy_segment(rsm, work, 0, 40, 139, epoch=1)
    discovery = SegmentDiscovery(open_store(remote.as_uri()), cluster=CLUSTER)
    assert spans(discovery.ranges(TOPIC, 0)) == [
        (str(old.segment_id.id), 0, 39),
        (str(new.segment_id.id), 40, 139),
    ]


@pytest.mark.parametrize("bits", [1, 5, 12])
async def test_entropy_bits_must_match_the_brokers(tmp_path: Path, bits: int) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    rsm = rsm_for(remote, **{"key.prefix": "tiered/", "key.prefix.entropy.bits": str(bits)})
    for partition in range(4):
        await copy_segment(rsm, work, partition, 0, 29)
    hashed = {p.name for p in (remote / "tiered").iterdir()}
    assert hashed == {rsm.layout.entropy(TOPIC, p).rstrip("/") for p in range(4)}

    right = SegmentDiscovery(
        open_store(remote.as_uri(), {"key.prefix": "tiered/"}), entropy_bits=bits
    )
    assert right.clusters() == [CLUSTER]
    assert right.partitions(TOPIC) == [0, 1, 2, 3]
    assert all(len(right.segments(TOPIC, p)) == 1 for p in range(4))
    for wrong_bits in (0, bits + 4):
        wrong = SegmentDiscovery(
            open_store(remote.as_uri(), {"key.prefix": "tiered/"}),
            cluster=CLUSTER,
            entropy_bits=wrong_bits,
        )
        assert wrong.partitions(TOPIC) == []
        assert all(wrong.segments(TOPIC, p) == [] for p in range(4))


async def test_several_clusters_need_the_cluster_option(tmp_path: Path) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    await copy_segment(rsm_for(remote), work, 0, 0, 9)
    other = LocalFsRemoteStorageManager()
    other.configure({"dir": str(remote), "cluster.id": "c2"})
    await copy_segment(other, work, 0, 0, 19)
    store = open_store(remote.as_uri())
    assert SegmentDiscovery(store).clusters() == ["c1", "c2"]
    with pytest.raises(ValueError, match="cluster"):
        SegmentDiscovery(store).segments(TOPIC, 0)
    assert SegmentDiscovery(store, cluster="c2").segments(TOPIC, 0)[0].end_offset == 19


async def test_range_reads_indexes_and_timestamps(tmp_path: Path) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    rsm = rsm_for(remote)
    await copy_segment(rsm, work, 0, 0, 99, codec=Compression.ZSTD)
    await copy_segment(rsm, work, 0, 100, 249, codec=Compression.LZ4)
    store = open_store(remote.as_uri())
    ranges = SegmentDiscovery(store).ranges(TOPIC, 0)
    second = ranges[1]
    position = start_position(store, second, 175)
    batches, _ = read_chunk(functools.partial(read_log, store), second.segment, position, 64)
    assert len(batches) == 1 and batches[0].base_offset == 170  # the batch holding 175
    assert offset_for_timestamp(store, ranges, record_ts(0)) == 0
    assert offset_for_timestamp(store, ranges, record_ts(123) - 5) == 123
    assert offset_for_timestamp(store, ranges, record_ts(249)) == 249
    assert offset_for_timestamp(store, ranges, record_ts(249) + 1) is None
    with pytest.raises(ObjectNotFoundError):
        store.get("c1/nothing-here.log")


async def test_a_damaged_indexes_object_only_costs_the_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    await copy_segment(rsm_for(remote), work, 0, 100, 249)
    store = open_store(remote.as_uri())
    [range_] = SegmentDiscovery(store).ranges(TOPIC, 0)
    assert range_.segment.indexes_key is not None
    (remote / range_.segment.indexes_key).write_bytes(b"\x01\x09garbage")
    with caplog.at_level(logging.WARNING, logger="tierbroker.pipeline.segments"):
        assert start_position(store, range_, 175) == 0  # read from the start instead
        assert offset_for_timestamp(store, [range_], record_ts(123) - 5) == 123
    assert "reading the segment without its indexes" in caplog.text


async def test_fetcher_skips_segments_deleted_while_reading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    rsm = rsm_for(remote)
    metas = [await copy_segment(rsm, work, 0, s, s + 99) for s in (0, 100, 200)]
    tp = KafkaTopicPartition(TOPIC, 0)
    with ThreadPoolExecutor(2) as executor:
        discovery = SegmentDiscovery(open_store(remote.as_uri()))
        # Nothing kept, nothing prefetched: every read asks the store, which deletes under it.
        chunks = ChunkCache(
            ChunkCacheConfig(cache_bytes=0, prefetch_bytes=0),
            MemoryChunkStore(),
            fetch_slots=2,
            fetch_timeout_s=5,
        )
        fetcher = RemoteFetcher(discovery, executor, chunks, chunk_bytes=256, refresh_interval_s=60)
        got = await fetcher.fetch(tp, 5, max_records=None, skip_missing=True)
        assert got.records[0].offset == 5 and got.records[0].key == b"k5"
        assert got.records[0].headers == (("h", b"5"),) and got.records[0].value == b"v5"
        assert got.records[2].value is None and got.records[2].serialized_value_size == -1
        position = got.position
        await rsm.delete_log_segment_data(metas[0])  # retention, mid-read
        await rsm.delete_log_segment_data(metas[1])
        with caplog.at_level(logging.WARNING, logger="tierbroker.pipeline.remote_fetcher"):
            got = await fetcher.fetch(tp, position, max_records=None, skip_missing=True)
        assert got.records[0].offset == 200
        assert (
            "disappeared while reading" in caplog.text and "skipping forward to 200" in caplog.text
        )
        not_covered = await fetcher.fetch(tp, 50, max_records=None, skip_missing=False)
        assert not not_covered.covered and not not_covered.records
        offsets = [r.offset for r in got.records]
        while got.records:
            got = await fetcher.fetch(tp, got.position, max_records=7, skip_missing=True)
            offsets += [r.offset for r in got.records]
        assert offsets == list(range(200, 300))
        assert (await fetcher.fetch(tp, 300, None, True)).covered is False


def test_pipeline_imports_protocol_and_storage_only() -> None:
    forbidden = {"rlm", "broker", "tests"}
    offenders = {}
    for path in (ROOT / "pipeline").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        if names & forbidden:
            offenders[str(path.relative_to(ROOT))] = sorted(names & forbidden)
    assert offenders == {}


def test_storage_urls() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        open_store("gs://bucket/x")
    with pytest.raises(ValueError, match="not a directory"):
        open_store("file:///does/not/exist")
    with pytest.raises(ValueError, match="go together"):
        open_store("s3://b/p", {"storage.aws.access.key.id": "x"})
    s3 = open_store("s3://bucket/some/prefix/?endpoint=http://127.0.0.1:1&path_style=true")
    assert s3.key_prefix == "some/prefix/" and s3.url == "s3://bucket/some/prefix/"


def test_a_committed_view_cuts_the_ranges_at_its_stable_end_and_knows_aborted_records() -> None:
    """The broker-free reader's read_committed: no range reaches the stable end (one that
    straddles it is cut), and only a producer's records inside an aborted range go."""
    ranges = [
        SegmentRange(segment(0, 99, 0, "a"), 0, 99),
        SegmentRange(segment(100, 199, 0, "b"), 100, 199),
        SegmentRange(segment(200, 299, 0, "c"), 200, 299),
    ]
    view = CommittedView({7: ((10, 20),)}, stable_end=150)
    assert spans(view.trim(ranges)) == [("a", 0, 99), ("b", 100, 149)]
    assert view.is_aborted(7, 10) and view.is_aborted(7, 19)
    assert not view.is_aborted(7, 20)  # the marker itself, then later transactions
    assert not view.is_aborted(8, 15)  # another producer's records in the range


class CountingStore(LocalObjectStore):
    """A local store that records every ranged read of a log."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets: list[tuple[str, int, int | None]] = []
        self.lock = threading.Lock()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key.endswith(".log"):
            with self.lock:
                self.gets.append((key, start, end))
        return super().get(key, start, end)


async def test_a_sync_reader_fetches_each_chunk_once_and_prefetches_the_next_slices(
    tmp_path: Path,
) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    rsm = rsm_for(remote)
    for start in (0, 300, 600):
        await copy_segment(rsm, work, 0, start, start + 299)
    store = CountingStore(remote)
    ranges = SegmentDiscovery(store, cluster=CLUSTER).ranges(TOPIC, 0)
    segments = [r.segment for r in ranges]
    config = ChunkCacheConfig(chunk_bytes=4096, cache_bytes=1 << 20, prefetch_bytes=64 << 10)
    reader = ChunkReader(store, config, threads=3)
    try:
        read: list[int] = []
        for i, s in enumerate(segments):
            following = [(later, 0) for later in segments[i + 1 :]]
            chunk = functools.partial(reader.read, following=following)
            read += [b.base_offset for b in iter_batches_from(chunk, s, 0, None, 1000)]
            if i == 0:  # the other slices were prefetched while the first was read
                wait_until_quiet(reader)
                asked = {key for key, _, _ in store.gets}
                assert {s.log_key for s in segments} <= asked
        assert read == list(range(0, 900, BATCH))
        wait_until_quiet(reader)
        chunks = [(s.log_key, i * 4096) for s in segments for i in range(-(-s.size // 4096))]
        assert sorted((key, start) for key, start, _ in store.gets) == sorted(chunks)
    finally:
        reader.close()


def wait_until_quiet(reader: ChunkReader, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while reader.cache.loading and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not reader.cache.loading
