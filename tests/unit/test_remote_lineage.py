"""Leader-epoch lineages in the remote tier: lookups by (epoch, offset), KIP-852's
`remote_log_size` per lineage, reads and retention along the reader's own lineage, and
the broker-free readers resolving overlaps by the same rule."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.test_remote_metadata import MemoryTopic
from tests.unit.test_rlm_components import (
    TIP,
    batches_of,
    build_log,
    local_fs,
    metadata_of,
    new_reader,
    tier_rolled_segments,
)
from tierbroker.pipeline.discovery import RemoteSegment, resolve_overlaps
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import iter_batches
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.expiration_task import ExpirationTask, SegmentDeleter
from tierbroker.rlm.follower_task import highest_remote_offset
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.remote.lineage import (
    agreed_end,
    epoch_end_in,
    epoch_for_offset,
    in_lineage,
)
from tierbroker.storage.remote.metadata_cache import RemoteLogMetadataCache
from tierbroker.storage.remote.request_meter import ObjectStoreMeter
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


def seg(
    start: int, end: int, *epochs: tuple[int, int], size: int = 100
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(TIP),
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=end,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_bytes=size,
        segment_leader_epochs=epochs,
        state=FINISHED,
    )


# The history: epoch 0's leader writes 0..149; a clean failover starts epoch 1 at 150,
# whose leader re-uploads 50..149 (it lagged in tiering) and writes up to 249. Broker B,
# which had epoch 1 only up to 199, is elected uncleanly in epoch 2 at 200 and writes
# 200..349: epoch 1's 200..249 belong to a dead lineage.
LINEAGES = {
    0: [(0, 0)],
    1: [(0, 0), (1, 150)],
    2: [(0, 0), (1, 150), (2, 200)],
}


def history() -> dict[str, RemoteLogSegmentMetadata]:
    return {
        "s1": seg(0, 99, (0, 0), size=1000),
        "s2": seg(100, 149, (0, 100), size=500),
        "s2w": seg(50, 149, (0, 50), size=1100),  # the re-upload: supersedes s2
        "s3": seg(150, 249, (1, 150), size=2000),  # epoch 1's leader, deposed: dead after 199
        "s4": seg(180, 299, (1, 180), (2, 200), size=3000),  # B's first copy: 2 follows 1
        "s5": seg(300, 349, (2, 300), size=700),
    }


def lineage_bytes(cache: RemoteLogMetadataCache, lineage: list[tuple[int, int]]) -> int:
    """The definition, by listing: bytes of the readable segments wholly in `lineage`."""
    return sum(
        s.segment_size_bytes
        for s in cache.readable_segments(TIP)
        if in_lineage(s.segment_leader_epochs, s.end_offset, lineage)
    )


def loaded(order: list[str]) -> tuple[RemoteLogMetadataCache, dict[str, RemoteLogSegmentMetadata]]:
    segments = history()
    cache = RemoteLogMetadataCache()
    for name in order:
        cache.put(segments[name])
    return cache, segments


def test_the_same_offset_in_two_lineages_is_served_from_the_asked_epoch() -> None:
    cache, s = loaded(list(history()))
    assert cache.segment_for_offset(TIP, 1, 220) == s["s3"]  # the deposed leader's record
    assert cache.segment_for_offset(TIP, 2, 220) == s["s4"]  # the new leader's
    assert cache.segment_for_offset(TIP, 2, 320) == s["s5"]
    assert cache.segment_for_offset(TIP, 0, 120) == s["s2w"]  # not the superseded s2
    assert cache.segment_for_offset(TIP, 0, 10) == s["s1"]
    held = cache.segment_for_offset(TIP, 1, 190)  # both hold (1, 190): the same record
    assert held in (s["s3"], s["s4"])


@pytest.mark.parametrize(
    ("epoch", "offset"),
    [(0, 150), (1, 250), (2, 350), (1, 149), (2, 199), (3, 300), (0, -1)],
)
def test_an_offset_outside_its_epoch_finds_no_segment(epoch: int, offset: int) -> None:
    cache, _ = loaded(list(history()))
    assert cache.segment_for_offset(TIP, epoch, offset) is None


def test_remote_log_size_sums_the_lineage_ending_in_each_epoch() -> None:
    for seed in range(6):  # whatever order the metadata arrives in
        order = list(history())
        random.Random(seed).shuffle(order)
        cache, s = loaded(order)
        assert {m.segment_id for m in cache.superseded_segments(TIP)} == {s["s2"].segment_id}
        for epoch, lineage in LINEAGES.items():
            assert cache.lineage(TIP, epoch) == lineage, (seed, epoch)
            assert cache.remote_log_size(TIP, epoch) == lineage_bytes(cache, lineage)
        assert cache.remote_log_size(TIP, 0) == 1000 + 1100
        assert cache.remote_log_size(TIP, 1) == 1000 + 1100 + 2000
        assert cache.remote_log_size(TIP, 2) == 1000 + 1100 + 3000 + 700  # not s3
        # A new leader in epoch 3 with nothing uploaded yet: epoch 2's lineage.
        assert cache.remote_log_size(TIP, 3) == cache.remote_log_size(TIP, 2)
        # A log's own lineage, given, decides (a replica whose log start moved to 150).
        assert cache.remote_log_size(TIP, 2, [(1, 150), (2, 200)]) == 3000 + 700


def test_remote_log_size_stays_exact_as_segments_are_deleted_in_any_order() -> None:
    for seed in range(6):
        cache, s = loaded(list(history()))
        doomed = [m for name, m in s.items() if name != "s2"]
        random.Random(seed).shuffle(doomed)
        for m in doomed:
            cache.put(m.with_state(DELETE_STARTED, 1))
            cache.put(m.with_state(DELETE_STARTED, 1).with_state(DELETE_FINISHED, 2))
            for epoch, lineage in LINEAGES.items():
                assert cache.remote_log_size(TIP, epoch, lineage) == lineage_bytes(
                    cache, lineage
                ), (seed, m.start_offset, epoch)
        assert cache.remote_log_size(TIP, 2) == 0


def test_a_restored_snapshot_answers_as_the_live_cache() -> None:
    live, _ = loaded(list(history()))
    restored = RemoteLogMetadataCache()
    superseded = {m.segment_id.id for m in live.superseded_segments(TIP)}
    readable, every = live.segment_lists(TIP)
    for m in readable:  # as `metadata_snapshot` lays them out: readable ones by offset
        restored.restore(m, superseded=False)
    for m in every:
        if m.segment_id.id in superseded:
            restored.restore(m, superseded=True)
    for epoch in (0, 1, 2, 3):
        assert restored.lineage(TIP, epoch) == live.lineage(TIP, epoch)
        assert restored.remote_log_size(TIP, epoch) == live.remote_log_size(TIP, epoch)
        for offset in range(0, 360, 5):
            assert restored.segment_for_offset(TIP, epoch, offset) == live.segment_for_offset(
                TIP, epoch, offset
            )


def test_the_broker_free_readers_resolve_overlaps_along_the_same_lineage() -> None:
    """Every offset the pipeline reads comes from a segment holding it in the epoch the
    broker's lineage gives it, and the broker finds a segment for each such offset."""
    cache, s = loaded(list(history()))
    pipeline = [
        RemoteSegment(
            "c",
            "t",
            0,
            "id",
            name,
            m.start_offset,
            m.end_offset,
            0,
            m.segment_leader_epochs,
            0,
            m.segment_size_bytes,
            "k",
            None,
            "m",
        )
        for name, m in s.items()
        if name != "s2"  # deleted by expiration: superseded
    ]
    lineage = LINEAGES[2]
    ranges = resolve_overlaps(pipeline)
    covered = []
    for r in ranges:
        epochs = r.segment.leader_epochs
        for offset in range(r.first_offset, r.last_offset + 1):
            epoch = epoch_for_offset(lineage, offset)
            assert epoch_for_offset(epochs, offset) == epoch, (r.segment.segment_id, offset)
            end = epoch_end_in(epochs, r.segment.end_offset, epoch)
            assert end is not None and end >= offset
            assert cache.segment_for_offset(TIP, epoch, offset) is not None
            covered.append(offset)
    assert covered == list(range(350))  # no gap, nothing twice
    assert "s3" not in {r.segment.segment_id for r in ranges if r.first_offset >= 200}


def test_a_segment_agrees_with_a_lineage_up_to_where_their_epochs_part() -> None:
    epochs = ((1, 150),)
    assert agreed_end(epochs, 249, LINEAGES[1]) == 249
    assert agreed_end(epochs, 249, LINEAGES[2]) == 199
    assert agreed_end(((0, 0),), 99, [(1, 50)]) == 49  # below the log start: trusted
    assert agreed_end(((3, 10),), 20, [(1, 0), (2, 15)]) == 9  # none of it


# ---------------------------------------------------------------------------------------
# The broker's reads and retention follow its log's lineage.
# ---------------------------------------------------------------------------------------


async def test_a_remote_read_stops_where_the_segment_leaves_the_readers_lineage(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    rsm = local_fs(tmp_path / "remote")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    await tier_rolled_segments(lg, rsm, rlmm)
    reader = new_reader(tmp_path, rlmm, rsm)
    first = batches_of(lg)[0]
    boundary = first[len(first) // 2].base  # the reader's log: epoch 1 from here
    lineage = ((0, 0), (1, boundary))
    whole = await reader.read(TIP, 0, 10_000_000, 5, ((0, 0),))
    assert max(b.last_offset for b in iter_batches(whole)) == first[-1].last
    got = await reader.read(TIP, 0, 10_000_000, 5, lineage)
    assert max(b.last_offset for b in iter_batches(got)) == boundary - 1
    with pytest.raises(KafkaError) as error:  # no segment holds epoch 1's records
        await reader.read(TIP, boundary, 10_000_000, 5, lineage)
    assert error.value.code == ErrorCode.offset_out_of_range
    assert await reader.find_offset_by_timestamp(TIP, 0, boundary, lineage) is None
    await reader.close()
    lg.close()


async def test_size_retention_right_after_an_unclean_failover_uses_the_new_leaders_lineage(
    tmp_path: Path,
) -> None:
    """The deposed leader uploaded epoch 1 from N, which the new leader, elected uncleanly
    in epoch 2 at N, never had: neither counted against retention.bytes nor expired by
    it, while the oldest segments of the new leader's lineage are."""
    lg = build_log(tmp_path / "t-0", batches=300)
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    rsm = local_fs(tmp_path / "remote")
    copied = await tier_rolled_segments(lg, rsm, rlmm)
    n = copied[-1].end_offset + 1
    dead = dataclasses.replace(
        metadata_of(TIP, lg.segments[0]),
        start_offset=n,
        end_offset=n + 99,
        segment_size_bytes=50_000_000,
        segment_leader_epochs=((1, n),),
    )
    await rlmm.add_remote_log_segment_metadata(dead)
    await rlmm.update_remote_log_segment_metadata(dead.with_state(FINISHED, 1))
    lg.leader_epoch_cache.assign(2, n)  # this broker leads now; nothing of epoch 2 uploaded
    lineage = lg.leader_epoch_cache.entries
    ours = sum(m.segment_size_bytes for m in copied)
    assert rlmm.remote_log_size(TIP, 2, lineage) == ours
    active = lg.segments[-1].size
    keep = 3
    retention = sum(m.segment_size_bytes for m in copied[-keep:]) + active
    lg.config = dataclasses.replace(lg.config, retention_bytes=retention)
    config = RemoteLogManagerConfig()
    await ExpirationTask(
        TieredPartition(TIP, lg),
        config,
        rlmm,
        SegmentDeleter(config, rsm, rlmm, lambda _: None),
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
    ).run_once()
    left = {m.segment_id for m in rlmm.readable_segments(TIP)}
    assert left == {m.segment_id for m in copied[-keep:]} | {dead.segment_id}
    assert lg.log_start_offset == copied[-keep].start_offset
    assert rlmm.remote_log_size(TIP, 2, lineage) == retention - active
    lg.close()


def test_lineage_helpers_name_no_epoch_before_the_first() -> None:
    assert epoch_for_offset([(3, 10)], 9) == -1
    assert epoch_for_offset([(3, 10), (5, 20)], 25) == 5


# ---------------------------------------------------------------------------------------
# Random histories of clean and unclean elections, uploads and deletions.
# ---------------------------------------------------------------------------------------


def random_history(rng: random.Random) -> tuple[dict[int, list[tuple[int, int]]], dict[int, int]]:
    """Each epoch's lineage and log end offset: every new leader continues the previous
    one's log (a clean election) or a prefix of it (an unclean one)."""
    lineages: dict[int, list[tuple[int, int]]] = {0: [(0, 0)]}
    ends = {0: rng.randint(20, 200)}
    for epoch in range(1, rng.randint(2, 7)):
        before, end = lineages[epoch - 1], ends[epoch - 1]
        start = end if rng.random() < 0.5 else rng.randint(before[-1][1] + 1, end)
        kept = [(e, s) for e, s in before if s < start]
        lineages[epoch] = [*kept, (epoch, start)]
        ends[epoch] = start + rng.randint(20, 200)
    return lineages, ends


def random_upload(
    rng: random.Random, lineage: list[tuple[int, int]], end: int
) -> RemoteLogSegmentMetadata:
    """A segment some leader of `lineage` (up to `end`) copied: its epochs clipped to it."""
    first = rng.randint(0, end - 1)
    last = rng.randint(first, min(end - 1, first + 80))
    epochs = tuple(
        (e, max(s, first))
        for i, (e, s) in enumerate(lineage)
        if s <= last and (i + 1 == len(lineage) or lineage[i + 1][1] > first)
    )
    return seg(first, last, *epochs, size=rng.randint(1, 1000))


@pytest.mark.parametrize("seed", range(40))
def test_random_histories_keep_lookups_and_sizes_exact(seed: int) -> None:
    rng = random.Random(seed)
    lineages, ends = random_history(rng)
    cache = RemoteLogMetadataCache()
    uploads = []
    for _ in range(rng.randint(5, 40)):
        epoch = rng.choice(list(lineages))
        uploads.append(random_upload(rng, lineages[epoch], ends[epoch]))
        cache.put(uploads[-1])
    for step in range(len(uploads) + 1):
        readable = cache.readable_segments(TIP)
        for epoch, lineage in lineages.items():
            assert cache.remote_log_size(TIP, epoch, lineage) == lineage_bytes(cache, lineage)
            for offset in range(0, ends[epoch], 3):
                e = epoch_for_offset(lineage, offset)
                found = cache.segment_for_offset(TIP, e, offset)
                holders = [
                    s
                    for s in readable
                    if epoch_for_offset(s.segment_leader_epochs, offset) == e
                    and s.start_offset <= offset <= s.end_offset
                ]
                assert (found is not None) == bool(holders), (seed, step, epoch, offset)
                assert found is None or found in holders
        # Nothing superseded holds a record that no readable segment holds (until the
        # holder is deleted: expiration deletes superseded segments first).
        for s in cache.superseded_segments(TIP) if step == 0 else []:
            for offset in range(s.start_offset, s.end_offset + 1):
                e = epoch_for_offset(s.segment_leader_epochs, offset)
                assert cache.segment_for_offset(TIP, e, offset) is not None, (seed, step)
        if step < len(uploads):  # then expiration deletes one, in any order
            gone = rng.choice([u for u in uploads if cache.contains(u)])
            cache.put(gone.with_state(DELETE_STARTED, 1))
            cache.put(gone.with_state(DELETE_STARTED, 1).with_state(DELETE_FINISHED, 2))


async def test_a_new_leader_resumes_copying_below_where_its_epoch_ended(tmp_path: Path) -> None:
    """Kafka's cap on the highest remote offset: the deposed leader of epoch 1 uploaded
    beyond where epoch 1 ends in this log (an unclean election started epoch 2 there), so
    this log resumes after its own epoch 1, not after the dead lineage's upload."""
    lg = build_log(tmp_path / "t-0", batches=300)
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    copied = await tier_rolled_segments(lg, local_fs(tmp_path / "remote"), rlmm)
    n = copied[-1].end_offset + 1
    assert lg.log_end_offset > n + 21
    assert highest_remote_offset(rlmm, TIP, lg) == n - 1
    dead = dataclasses.replace(
        metadata_of(TIP, lg.segments[0]),
        start_offset=n,
        end_offset=n + 20,
        segment_leader_epochs=((1, n),),
    )
    await rlmm.add_remote_log_segment_metadata(dead)
    await rlmm.update_remote_log_segment_metadata(dead.with_state(FINISHED, 1))
    lg.leader_epoch_cache.assign(1, n)
    assert highest_remote_offset(rlmm, TIP, lg) == n + 20  # epoch 1 is this log's latest
    lg.leader_epoch_cache.assign(2, n + 10)  # epoch 1 ended at n + 10 here
    assert highest_remote_offset(rlmm, TIP, lg) == n + 9
    lg.close()
