"""The log cleaner's parts on logs in a temp dir: a batch's records filtered with offsets,
producer fields and timestamps kept; a pass that keeps the last record of each key
(and the last batch of each producer, and each group's end); a full offset map that
ends a pass early; the choice of what is cleanable; the swap, stopped after each of
its steps and completed or undone by the next load; and a corrupt log made
uncleanable while the others are cleaned."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from tierbroker.protocol.records import (
    BatchView,
    Compression,
    build_batch,
    decode_batch,
    decode_records,
    iter_batches,
)
from tierbroker.protocol.records.control import ControlRecordType, EndTxnMarker
from tierbroker.protocol.records.filtering import keyed_records, retain
from tierbroker.storage import segment_swap
from tierbroker.storage.checkpoints import OffsetCheckpointFile
from tierbroker.storage.cleaner import CleaningResult, clean
from tierbroker.storage.log import AppendOptions, Log, now_ms
from tierbroker.storage.log_cleaner import CleanerConfig, LogCleaner
from tierbroker.storage.log_cleaner_manager import CLEANER_CHECKPOINT, LogCleanerManager
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.offset_map import OffsetMap
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.storage.transaction_index import AbortedTxn

TP = TopicPartition("c", 0)
COMPACT = LogConfig(cleanup_policy="compact", segment_bytes=1500, min_cleanable_dirty_ratio=0.01)


Row = tuple[int, bytes | None, bytes | None]


def records(lg: Log) -> list[Row]:
    data = b"".join(s.log_path.read_bytes() for s in lg.segments)
    return [(r.offset, r.key, r.value) for r in decode_records(data)]


def fill(lg: Log, rounds: int, keys: int, *, start_ms: int | None = None) -> None:
    """`keys` keys overwritten `rounds` times, one record a batch, odd keys gzipped; the
    log rolled and its high watermark at its end."""
    now = now_ms() if start_ms is None else start_ms
    for r in range(rounds):
        for k in range(keys):
            codec = Compression.GZIP if k % 2 else Compression.NONE
            batch = build_batch([(b"k%d" % k, b"r%d" % r, [], now)], compression=codec)
            lg.append_as_leader(bytearray(batch), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)


def one_pass(
    lg: Log, manager: LogCleanerManager, now: int, map_bytes: int = 1 << 20
) -> CleaningResult:
    """Plan, clean and swap in as the `LogCleaner` does, in this process."""
    chosen = manager.grab_filthiest([lg], now)
    assert chosen is not None
    cleaner = LogCleaner.__new__(LogCleaner)
    cleaner.config = CleanerConfig(dedupe_buffer_size=map_bytes)
    planned = [s for s in lg.segments[:-1] if s.base_offset < chosen.first_uncleanable_offset]
    result = clean(cleaner._task(chosen, planned, now))
    by_base = {s.base_offset: s for s in planned}
    for group in result.groups:
        replaced = [by_base[b] for b in group.replaced]
        assert lg.replace_segments(group.base_offset, replaced, [s.size for s in replaced])
    manager.done_cleaning(lg, result.end_offset)
    return result


@pytest.fixture
def lg(tmp_path: Path) -> Log:
    return Log(tmp_path / "c-0", TP, COMPACT, uuid.uuid4())


# Filtering one batch ----------------------------------------------------------------


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD])
def test_a_filtered_batch_keeps_offsets_producer_fields_and_timestamps(codec: Compression) -> None:
    original = build_batch(
        [(b"a", b"1", [], 1000), (b"b", None, [("h", b"v")], 1500), (b"c", b"3", [], 900)],
        base_offset=40,
        compression=codec,
        producer_id=9,
        producer_epoch=2,
        base_sequence=17,
        partition_leader_epoch=4,
    )
    view = BatchView(original)
    raw, found = keyed_records(view)
    assert [(r.offset_delta, r.key, r.is_tombstone) for r in found] == [
        (0, b"a", False),
        (1, b"b", True),
        (2, b"c", False),
    ]
    kept = BatchView(retain(view, raw, found[1:], delete_horizon_ms=50_000))
    kept.validate()
    decoded = decode_batch(kept)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in decoded.records] == [
        (41, b"b", None, 1500),
        (42, b"c", b"3", 900),
    ]
    assert decoded.records[0].headers[0].value == b"v"
    assert (kept.base_offset, kept.last_offset, kept.max_timestamp) == (40, 42, 1500)
    assert (kept.producer_id, kept.producer_epoch, kept.base_sequence) == (9, 2, 17)
    assert (kept.partition_leader_epoch, kept.compression) == (4, codec)
    assert kept.delete_horizon_ms == 50_000 and view.delete_horizon_ms is None
    empty = BatchView(retain(view, raw, []))
    empty.validate()
    assert (empty.record_count, empty.last_offset, empty.compression) == (0, 42, Compression.NONE)


def test_the_offset_map_is_bounded_by_memory() -> None:
    offsets = OffsetMap(memory_bytes=160 * 100, load_factor=0.5)
    assert offsets.slots == 50
    for i in range(50):
        offsets.put(b"key-%d" % i, 100 + i)
    offsets.put(b"key-3", 200)
    assert (offsets.get(b"key-3"), offsets.get(b"other"), offsets.latest_offset) == (200, -1, 200)
    assert offsets.free_slots() == 0 and offsets.utilization == 1.0


# A pass -----------------------------------------------------------------------------


def test_a_pass_keeps_the_last_record_of_each_key_at_its_offset(lg: Log, tmp_path: Path) -> None:
    fill(lg, rounds=30, keys=10)
    end = lg.log_end_offset
    manager = LogCleanerManager([tmp_path])
    result = one_pass(lg, manager, now_ms())
    assert result.end_offset == end
    assert [(o, k) for o, k, _ in records(lg)] == [(290 + k, b"k%d" % k) for k in range(10)]
    assert {v for _, _, v in records(lg)} == {b"r29"}
    assert lg.log_end_offset == end and lg.log_start_offset == 0
    # Fetches and ListOffsets find records across the gaps: a fetch in a gap gets the
    # batch that spans it (maybe emptied), and the consumer moves past it.
    fetched = lg.read(5, 1 << 20, lg.high_watermark, True).records
    assert fetched is not None and next(iter_batches(fetched.read())).last_offset >= 5
    fetched = lg.read(289, 1 << 20, lg.high_watermark, True).records
    assert fetched is not None and next(decode_records(fetched.read())).offset == 290
    assert lg.fetch_offset_by_timestamp(0) is not None
    lg.close()
    reopened = Log(lg.dir, TP, COMPACT, lg.topic_id)  # an unclean load recovers them too
    assert [o for o, _, _ in records(reopened)] == [290 + k for k in range(10)]
    assert reopened.log_end_offset == end


def test_aborted_records_go_markers_stay_and_open_transactions_are_not_cleaned(
    lg: Log, tmp_path: Path
) -> None:
    """Kafka's cleaner and transactions: an aborted transaction's records neither count
    as a key's last value nor stay; markers stay whole; the cleaned segment keeps the
    transaction index; nothing from the oldest open transaction on is cleaned."""
    now = now_ms()

    def txn(pid: int, seq: int, key: bytes, value: bytes) -> None:
        batch = build_batch(
            [(key, value, [], now)],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=seq,
            is_transactional=True,
        )
        lg.append_as_leader(bytearray(batch), 0, None, AppendOptions(transactional_id="t"))

    lg.append_as_leader(bytearray(build_batch([(b"k", b"committed", [], now)])), 0)  # 0
    txn(7, 0, b"k", b"aborted")  # 1
    lg.append_end_txn_marker(7, 0, EndTxnMarker(ControlRecordType.ABORT, 0), 0)  # 2
    txn(7, 1, b"j", b"open")  # 3: still open when cleaned
    lg.roll()
    lg.append_as_leader(bytearray(build_batch([(b"j", b"later", [], now)])), 0)  # 4
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.last_stable_offset == 3
    manager = LogCleanerManager([tmp_path])
    later = now_ms() + 1000  # past every batch's timestamp: the markers' are their append's
    assert manager.cleanable(lg, later).first_uncleanable_offset == 0  # the segment holds 3
    lg.append_end_txn_marker(7, 0, EndTxnMarker(ControlRecordType.COMMIT, 0), 0)  # 5
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)

    one_pass(lg, manager, later)
    kept = [
        (o, k, v) for o, k, v in records(lg) if k not in (b"\x00\x00\x00\x00", b"\x00\x00\x00\x01")
    ]
    assert kept == [(0, b"k", b"committed"), (4, b"j", b"later")]
    markers = [
        b for s in lg.segments for b in iter_batches(s.log_path.read_bytes()) if b.is_control
    ]
    assert [b.base_offset for b in markers] == [2, 5]
    assert lg.collect_aborted_txns(0, lg.log_end_offset) == [AbortedTxn(7, 1, 2, 3)]


def test_the_last_batch_of_an_idempotent_producer_stays_empty(lg: Log, tmp_path: Path) -> None:
    now = now_ms()
    for seq in range(3):
        batch = build_batch(
            [(b"same", b"v%d" % seq, [], now)], producer_id=5, producer_epoch=0, base_sequence=seq
        )
        lg.append_as_leader(bytearray(batch), 0)
    lg.append_as_leader(bytearray(build_batch([(b"same", b"plain", [], now)])), 0)
    fill(lg, rounds=1, keys=1)  # one more batch of another key, then a roll
    one_pass(lg, LogCleanerManager([tmp_path]), now_ms())
    batches = [
        b for s in lg.segments for b in iter_batches(s.log_path.read_bytes()) if b.producer_id == 5
    ]
    assert [(b.base_offset, b.record_count, b.base_sequence) for b in batches] == [(2, 0, 2)]
    # The producer goes on from its sequence after a restart.
    lg.close()
    reopened = Log(lg.dir, TP, COMPACT, lg.topic_id)
    follow_up = build_batch(
        [(b"same", b"v3", [], now)], producer_id=5, producer_epoch=0, base_sequence=3
    )
    assert reopened.append_as_leader(bytearray(follow_up), 0).record_count == 1


def test_tombstones_go_after_their_horizon_and_only_then(lg: Log, tmp_path: Path) -> None:
    now = now_ms()
    fill(lg, rounds=3, keys=4, start_ms=now)
    lg.append_as_leader(bytearray(build_batch([(b"k0", None, [], now)])), 0)
    fill(lg, rounds=1, keys=0)
    lg.append_as_leader(bytearray(build_batch([(b"x", b"roll", [], now)])), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    manager = LogCleanerManager([tmp_path])
    one_pass(lg, manager, now)
    assert (b"k0", None) in [(k, v) for _, k, v in records(lg)]
    horizon = now + COMPACT.delete_retention_ms
    lg.append_as_leader(bytearray(build_batch([(b"x", b"roll-2", [], now)])), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    one_pass(lg, manager, horizon - 1)
    assert b"k0" in [k for _, k, _ in records(lg)]
    lg.append_as_leader(bytearray(build_batch([(b"x", b"roll-3", [], now)])), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    one_pass(lg, manager, horizon)
    assert b"k0" not in [k for _, k, _ in records(lg)]
    assert sorted(k for _, k, _ in records(lg)) == [b"k1", b"k2", b"k3", b"x"]


def test_a_full_map_ends_the_pass_early_and_the_next_goes_on(lg: Log, tmp_path: Path) -> None:
    fill(lg, rounds=2, keys=60)
    manager = LogCleanerManager([tmp_path])
    first = one_pass(lg, manager, now_ms(), map_bytes=160 * 30)  # 27 keys a pass
    assert first.end_offset == 27 and first.stats.map_utilization == 1.0
    passes = 1
    while manager.cleanable(lg, now_ms()).cleanable_bytes:
        one_pass(lg, manager, now_ms(), map_bytes=160 * 30)
        passes += 1
    assert passes >= 120 // 27
    assert records(lg) == [(60 + k, b"k%d" % k, b"r1") for k in range(60)]


def test_what_is_cleanable_stops_at_the_high_watermark_and_min_lag(lg: Log, tmp_path: Path) -> None:
    fill(lg, rounds=10, keys=10)
    manager = LogCleanerManager([tmp_path])
    everything = manager.cleanable(lg, now_ms())
    assert everything.first_uncleanable_offset == lg.active_segment.base_offset
    assert everything.cleanable_ratio == 1.0
    lg.update_high_watermark(lg.segments[2].base_offset + 1)  # inside the third segment
    assert manager.cleanable(lg, now_ms()).first_uncleanable_offset == lg.segments[2].base_offset
    lg.update_high_watermark(lg.log_end_offset)
    lagging = Log(
        lg.dir, TP, LogConfig(cleanup_policy="compact", min_compaction_lag_ms=60_000), lg.topic_id
    )
    assert manager.cleanable(lagging, now_ms()).cleanable_bytes == 0
    # A checkpoint past the log end (a truncation) makes the whole log dirty again.
    manager.checkpoints[lg.dir.parent] = {TP: lg.log_end_offset + 5}
    assert manager.cleanable(lg, now_ms()).first_dirty_offset == 0


def test_max_compaction_lag_cleans_a_log_below_the_dirty_ratio(tmp_path: Path) -> None:
    config = LogConfig(
        cleanup_policy="compact",
        segment_bytes=1500,
        min_cleanable_dirty_ratio=0.99,
        max_compaction_lag_ms=60_000,
    )
    lg = Log(tmp_path / "c-0", TP, config, uuid.uuid4())
    fill(lg, rounds=5, keys=5, start_ms=now_ms() - 120_000)
    manager = LogCleanerManager([tmp_path])
    end = one_pass(lg, manager, now_ms()).end_offset  # all dirty: ratio 1.0
    fill(lg, rounds=1, keys=5, start_ms=now_ms() - 120_000)  # a little, but old
    assert manager.cleanable(lg, now_ms()).cleanable_ratio < 0.99
    chosen = manager.grab_filthiest([lg], now_ms())
    assert chosen is not None and chosen.needs_compaction_now
    assert chosen.first_dirty_offset == end
    # The checkpoint outlives the manager: a new one (a restart) reads it from the file.
    manager.done_cleaning(lg, end)
    OffsetCheckpointFile(tmp_path / CLEANER_CHECKPOINT).write(manager.checkpoints[tmp_path])
    assert LogCleanerManager([tmp_path]).cleanable(lg, now_ms()).first_dirty_offset == end


def test_a_truncation_brings_the_checkpoint_down_to_it(lg: Log, tmp_path: Path) -> None:
    fill(lg, rounds=10, keys=10)
    manager = LogCleanerManager([tmp_path])
    end = one_pass(lg, manager, now_ms()).end_offset
    cut = lg.segments[-2].base_offset + 1  # inside the last rolled segment
    lg.truncate_to(cut)
    fill(lg, rounds=5, keys=10)  # new records above the cut, from another leader
    assert cut < end < lg.log_end_offset
    assert manager.cleanable(lg, now_ms()).first_dirty_offset == cut
    # Truncations between two looks: the lowest counts, 0 included.
    lg.truncate_fully_and_start_at(0)
    fill(lg, rounds=2, keys=5)
    lg.truncate_to(5)
    assert lg.take_lowest_truncation() == 0


def test_only_compact_logs_are_chosen_and_compact_alone_keeps_old_segments(
    tmp_path: Path,
) -> None:
    deleting = Log(
        tmp_path / "d-0",
        TopicPartition("d", 0),
        LogConfig(segment_bytes=1500, retention_ms=1),
        uuid.uuid4(),
    )
    compacted = Log(
        tmp_path / "c-0",
        TP,
        LogConfig(cleanup_policy="compact", segment_bytes=1500, retention_ms=1),
        uuid.uuid4(),
    )
    old = now_ms() - 10_000
    fill(deleting, rounds=5, keys=5, start_ms=old)
    fill(compacted, rounds=5, keys=5, start_ms=old)
    both = Log(
        tmp_path / "b-0",
        TopicPartition("b", 0),
        LogConfig(cleanup_policy="compact,delete", segment_bytes=1500, retention_ms=1),
        uuid.uuid4(),
    )
    fill(both, rounds=5, keys=5, start_ms=old)
    tiered = Log(
        tmp_path / "t-0",
        TopicPartition("t", 0),
        LogConfig(cleanup_policy="compact", remote_storage_enable=True, segment_bytes=1500),
        uuid.uuid4(),
    )
    fill(tiered, rounds=5, keys=5)
    assert LogCleanerManager([tmp_path]).grab_filthiest([deleting, tiered], now_ms()) is None
    assert deleting.delete_old_segments() and not compacted.delete_old_segments()
    assert both.delete_old_segments()  # compact,delete: retention applies too


# The swap, stopped after each step --------------------------------------------------


def stop_swap_after(lg: Log, tmp_path: Path, step: int) -> tuple[list[Row], list[Row], int]:
    """Clean, then swap the first group in by hand up to `step`, as a crash would leave
    it; the records before and after, and where the first group ends."""
    before = records(lg)
    manager = LogCleanerManager([tmp_path])
    chosen = manager.grab_filthiest([lg], now_ms())
    assert chosen is not None
    cleaner = LogCleaner.__new__(LogCleaner)
    cleaner.config = CleanerConfig()
    planned = list(lg.segments[:-1])
    result = clean(cleaner._task(chosen, planned, now_ms()))
    group = result.groups[0]
    directory = lg.dir
    base = group.base_offset
    replaced = [s for s in planned if s.base_offset in group.replaced]
    name = f"{base:020d}"
    if step >= 1:  # the index renamed, the log not yet
        os.rename(directory / f"{name}.index.cleaned", directory / f"{name}.index.swap")
    if step >= 2:
        segment_swap.commit(directory, base)
    if step >= 3:  # one of the old segments renamed away
        replaced[0].rename_to_deleted()
    if step >= 4:
        for old in replaced[1:]:
            old.rename_to_deleted()
        os.rename(directory / f"{name}.index.swap", directory / f"{name}.index")
    lg.close()
    reopened = Log(directory, TP, COMPACT, lg.topic_id)
    after = records(reopened)
    reopened.close()
    return before, after, replaced[-1].next_offset


@pytest.mark.parametrize("step", [0, 1, 2, 3, 4])
def test_a_swap_cut_short_leaves_the_old_or_the_new_segments(
    lg: Log, tmp_path: Path, step: int
) -> None:
    fill(lg, rounds=6, keys=8)
    copy = Log(tmp_path / "copy" / "c-0", TP, COMPACT, uuid.uuid4())
    fill(copy, rounds=6, keys=8)
    one_pass(copy, LogCleanerManager([tmp_path / "copy"]), now_ms())
    cleaned = records(copy)
    before, after, end = stop_swap_after(lg, tmp_path, step)
    offsets = [o for o, _, _ in after]
    assert offsets == sorted(set(offsets))  # no record twice, none out of order
    # Up to the commit the old records stay; from it, the first group's cleaned ones.
    swapped = [r for r in cleaned if r[0] < end] + [r for r in before if r[0] >= end]
    assert after == (before if step < 2 else swapped)
    assert step < 2 or len(after) < len(before)
    assert not list(lg.dir.glob("*.cleaned")) and not list(lg.dir.glob("*.swap"))


# The cleaner, with its process pool --------------------------------------------------


def test_a_corrupt_log_is_uncleanable_and_the_others_are_cleaned(tmp_path: Path) -> None:
    async def run() -> None:
        manager = LogManager([tmp_path / "logs"])
        config = COMPACT
        await manager.create_logs(
            [TopicPartition("good", 0), TopicPartition("bad", 0)], uuid.uuid4(), config
        )
        good, bad = manager.logs[TopicPartition("good", 0)], manager.logs[TopicPartition("bad", 0)]
        fill(good, rounds=10, keys=5)
        fill(bad, rounds=10, keys=5)
        corrupt = bytearray(bad.segments[0].log_path.read_bytes())
        corrupt[70] ^= 0xFF  # a flipped byte in a record: a CRC mismatch
        bad.segments[0].log_path.write_bytes(corrupt)
        cleaner = LogCleaner(manager, CleanerConfig(backoff_ms=50))
        cleaner.start()
        try:
            deadline = time.monotonic() + 60
            while len(records(good)) > 5 or not cleaner.manager.uncleanable:
                assert time.monotonic() < deadline, "no pass in time"
                await asyncio.sleep(0.05)
            assert cleaner.dead_threads == 0
        finally:
            await cleaner.stop(10)
        assert cleaner.manager.uncleanable == {tmp_path / "logs": {TopicPartition("bad", 0)}}
        checkpoint = (tmp_path / "logs" / "cleaner-offset-checkpoint").read_text().split()
        assert checkpoint[:2] == ["0", "1"] and checkpoint[2:4] == ["good", "0"]
        manager.shutdown()

    asyncio.run(run())
