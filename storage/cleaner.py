"""`clean`: one cleaning pass over one log, as Kafka's `Cleaner.doClean`, in a worker process.

The pass reads rolled segments only and writes new files beside them; the event loop
swaps them in (`Log.replace_segments`). It runs in a process of its own so that its
record parsing holds no lock the broker's event loop needs.

1. Build the offset map: each key's last offset in the dirty range
   [first dirty, first uncleanable). A full map ends the pass early: its end offset is
   then the last offset the map took, and the next pass goes on from there.
2. Group the segments below the end offset (the clean ones too) by size, and copy each
   group into one `<base>.log.cleaned` with its indexes, keeping of each record only
   what `_retained` keeps. Offsets never change.
3. An emptied batch is dropped, unless it is the last batch of an idempotent producer
   (its sequence and epoch must stay: Kafka's RETAIN_EMPTY) or the last of its group
   (the new segment ends where the old ones ended, so a swap cut short by a crash can
   be completed from the new files alone).
4. Transactions: the range ends at the last stable offset (the event loop's choice).
   Batches of aborted transactions give no key to the map and are emptied; markers
   stay whole, and each new segment's transaction index holds its old ones' entries.

A batch that fails its CRC or does not parse ends the pass (`CleaningError`): the
broker marks the log uncleanable. The pass stops (`CleaningAborted`) when the
broker stops or is gone, so that no orphan writes into a log dir the next start owns.
"""

from __future__ import annotations

import ctypes
import multiprocessing.synchronize
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import (
    BatchView,
    InvalidRecordError,
    iter_batches,
    whole_batches_size,
)
from tierbroker.protocol.records.filtering import KeyedRecord, keyed_records, retain
from tierbroker.storage import segment_swap
from tierbroker.storage.file_cache import LogFileCache
from tierbroker.storage.offset_map import OffsetMap
from tierbroker.storage.segment import LogSegment
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.storage.transaction_index import AbortedTxn, TransactionIndex

IO_BUFFER_BYTES = 512 * 1024  # log.cleaner.io.buffer.size
INT32_MAX = 2**31 - 1
_OFFSET_INDEX_ENTRY = 8
_TIME_INDEX_ENTRY = 12
_WRITE_BYTES = 1 << 20  # cleaned batches are appended this many bytes at a time
_PR_SET_PDEATHSIG = 1


class CleaningAborted(Exception):
    """The broker stopped or died during the pass: its files are left for the next start."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentToClean:
    """A rolled segment as the event loop saw it when the pass was planned."""

    base_offset: int
    path: str
    size: int
    next_offset: int
    offset_index_entries: int
    time_index_entries: int
    mtime_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CleaningTask:
    topic_partition: TopicPartition
    directory: str
    segments: tuple[SegmentToClean, ...]  # from the log's first segment, all rolled
    first_dirty_offset: int
    first_uncleanable_offset: int
    producer_last_offsets: dict[int, int]  # producer id -> offset of its last record
    aborted_txns: tuple[AbortedTxn, ...]  # overlapping the segments, markers anywhere
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    max_index_bytes: int
    index_interval_bytes: int
    map_memory_bytes: int
    map_load_factor: float
    io_max_bytes_per_second: float


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """One new segment (`<base>.log.cleaned`) that replaces the segments at `replaced`."""

    base_offset: int
    replaced: tuple[int, ...]
    size: int


@dataclass(slots=True)
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    dirty_bytes: int = 0  # read while building the map
    map_utilization: float = 0.0
    elapsed_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CleaningResult:
    end_offset: int  # the new first dirty offset: the cleaner checkpoint
    groups: tuple[CleanedGroup, ...]
    stats: CleanerStats = field(default_factory=CleanerStats)


# Set in each worker process by `init_worker`.
_stop: multiprocessing.synchronize.Event | None = None
_parent_pid = -1


def init_worker(stop: multiprocessing.synchronize.Event, broker_pid: int) -> None:
    """The pool's initializer: the event the broker sets when it stops. On Linux the
    worker also dies with the broker (a kill -9 leaves no orphan writing files, nor one
    idle forever on a queue it holds both ends of)."""
    global _stop, _parent_pid
    _stop, _parent_pid = stop, broker_pid
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != broker_pid:  # the broker died before the line above
        os._exit(1)


def _check_running() -> None:
    if (_stop is not None and _stop.is_set()) or (_parent_pid > 0 and os.getppid() != _parent_pid):
        raise CleaningAborted("the broker stopped")


class Throttler:
    """Holds I/O to `rate` bytes a second (`log.cleaner.io.max.bytes.per.second`)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.bytes = 0

    def maybe_throttle(self, size: int) -> None:
        self.bytes += size
        if self.rate == float("inf"):
            return
        ahead = self.bytes / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            if _stop is not None and _stop.wait(ahead):
                raise CleaningAborted("the broker stopped")
            if _stop is None:
                time.sleep(ahead)


class CleaningError(Exception):
    """The pass failed on this log (a corrupt batch, a map too small for a batch): it
    is not tried again until the broker restarts, as Kafka marks it uncleanable."""


def clean(task: CleaningTask) -> CleaningResult:
    """Run one pass; the new segments' files are `.cleaned`, fsynced, for the loop to swap.

    Raises CleaningError, CleaningAborted or OSError, each of which crosses the process
    boundary whole."""
    try:
        return _clean(task)
    except (CleaningAborted, OSError):
        raise
    except Exception as e:  # a corrupt batch, a map too small, or a bug: this log only
        raise CleaningError(f"{task.topic_partition}: {e}") from None


def _clean(task: CleaningTask) -> CleaningResult:
    started = time.monotonic()
    stats = CleanerStats()
    throttler = Throttler(task.io_max_bytes_per_second)
    offset_map = OffsetMap(task.map_memory_bytes, task.map_load_factor)
    end_offset = _build_offset_map(task, offset_map, stats, throttler)
    if end_offset <= task.first_dirty_offset:
        raise ValueError(
            f"{task.topic_partition}: log.cleaner.dedupe.buffer.size holds {offset_map.slots} "
            "keys, too few for one batch"
        )
    stats.map_utilization = offset_map.utilization
    groups = []
    for group in _group_segments(task, end_offset):
        groups.append(_clean_group(task, group, offset_map, stats, throttler))
    stats.elapsed_s = time.monotonic() - started
    return CleaningResult(end_offset, tuple(groups), stats)


def _batches(segment: SegmentToClean, throttler: Throttler) -> Iterator[BatchView]:
    """The segment's batches, CRC-checked, read `IO_BUFFER_BYTES` at a time (more for a
    larger batch)."""
    fd = os.open(segment.path, os.O_RDONLY)
    try:
        position, want = 0, IO_BUFFER_BYTES
        while position < segment.size:
            _check_running()
            remaining = segment.size - position
            chunk = os.pread(fd, min(want, remaining), position)
            throttler.maybe_throttle(len(chunk))
            whole = whole_batches_size(chunk)
            if whole == 0:
                if len(chunk) >= remaining:
                    raise InvalidRecordError(
                        ErrorCode.corrupt_message,
                        f"{segment.path}: no whole batch at position {position}",
                    )
                want *= 2
                continue
            for batch in iter_batches(memoryview(chunk)[:whole]):
                batch.validate()
                yield batch
            position += whole
            want = IO_BUFFER_BYTES
    finally:
        os.close(fd)


def _build_offset_map(
    task: CleaningTask, offset_map: OffsetMap, stats: CleanerStats, throttler: Throttler
) -> int:
    """Fill the map from the dirty range; the offset the pass cleans up to."""
    for segment in task.segments:
        if segment.next_offset <= task.first_dirty_offset:
            continue
        if segment.base_offset >= task.first_uncleanable_offset:
            break
        stats.dirty_bytes += segment.size
        for batch in _batches(segment, throttler):
            if (
                batch.last_offset < task.first_dirty_offset
                or batch.is_control
                or _is_aborted(task, batch)
            ):
                continue
            if batch.record_count > offset_map.free_slots():
                return offset_map.latest_offset + 1  # full: the next pass goes on
            _, records = keyed_records(batch)
            for record in records:
                offset = batch.base_offset + record.offset_delta
                if record.key is not None and offset >= task.first_dirty_offset:
                    offset_map.put(record.key, offset)
    return task.first_uncleanable_offset


def _group_segments(task: CleaningTask, end_offset: int) -> list[list[SegmentToClean]]:
    """Neighbours merged while the merged log and its indexes fit their limits and its
    offsets fit an index's 32-bit relative offsets (Kafka's groupSegmentsBySize)."""
    groups: list[list[SegmentToClean]] = []
    for segment in (s for s in task.segments if s.base_offset < end_offset):
        merged = [*groups[-1], segment] if groups else []
        if merged and (
            sum(s.size for s in merged) <= task.segment_bytes
            and _OFFSET_INDEX_ENTRY * sum(s.offset_index_entries for s in merged)
            <= task.max_index_bytes
            and _TIME_INDEX_ENTRY * sum(s.time_index_entries for s in merged)
            <= task.max_index_bytes
            and segment.next_offset - 1 - merged[0].base_offset <= INT32_MAX
        ):
            groups[-1] = merged
        else:
            groups.append([segment])
    return groups


def _clean_group(
    task: CleaningTask,
    group: list[SegmentToClean],
    offset_map: OffsetMap,
    stats: CleanerStats,
    throttler: Throttler,
) -> CleanedGroup:
    base = group[0].base_offset
    directory = Path(task.directory)
    segment_swap.discard(directory, base)  # left by a pass cut short
    cleaned = LogSegment(
        directory,
        base,
        index_interval_bytes=task.index_interval_bytes,
        max_index_bytes=task.max_index_bytes,
        created_ms=task.now_ms,
        file_cache=LogFileCache(4),
        suffix=segment_swap.CLEANED_SUFFIX,
    )
    group_end = group[-1].next_offset
    out = bytearray()
    for segment in group:
        for batch in _batches(segment, throttler):
            stats.bytes_read += batch.size_in_bytes
            kept = _kept_batch(task, batch, offset_map, stats, group_end)
            if kept is not None:
                out += kept
            if len(out) >= _WRITE_BYTES:
                _append(cleaned, out, stats, throttler)
                out = bytearray()
    _append(cleaned, out, stats, throttler)
    for segment in group:
        index = TransactionIndex(Path(segment.path).with_suffix(".txnindex"))
        for entry in index.entries:
            cleaned.txn_index.append(entry)
    cleaned.on_become_inactive()
    cleaned.flush()
    cleaned.close()
    # The new segment is as old as the newest it replaces, for time retention.
    os.utime(cleaned.log_path, ns=(group[-1].mtime_ns, group[-1].mtime_ns))
    return CleanedGroup(base, tuple(s.base_offset for s in group), cleaned.size)


def _append(
    segment: LogSegment, data: bytearray, stats: CleanerStats, throttler: Throttler
) -> None:
    if data:
        segment.append(list(iter_batches(memoryview(data))), data)
        stats.bytes_written += len(data)
        throttler.maybe_throttle(len(data))


def _kept_batch(
    task: CleaningTask,
    batch: BatchView,
    offset_map: OffsetMap,
    stats: CleanerStats,
    group_end: int,
) -> bytes | bytearray | memoryview | None:
    """What of `batch` goes into the cleaned segment: itself, a rewrite, or nothing."""
    if batch.is_control or batch.base_offset > offset_map.latest_offset:
        stats.records_read += batch.record_count
        stats.records_retained += batch.record_count
        return batch.payload()  # beyond what this pass decides on
    raw, records = keyed_records(batch)
    aborted = _is_aborted(task, batch)
    kept = [] if aborted else [r for r in records if _retained(task, batch, r, offset_map)]
    stats.records_read += len(records)
    stats.records_retained += len(kept)
    horizon = batch.delete_horizon_ms
    if horizon is None and any(r.is_tombstone for r in kept):
        horizon = task.now_ms + task.delete_retention_ms  # the tombstones' first clean
    elif len(kept) == len(records):
        return batch.payload()
    if kept:
        return retain(batch, raw, kept, horizon)
    last_of_producer = (
        batch.has_producer_id
        and task.producer_last_offsets.get(batch.producer_id) == batch.last_offset
    )
    if last_of_producer or batch.next_offset == group_end:
        return retain(batch, raw, [], horizon)
    return None


def _is_aborted(task: CleaningTask, batch: BatchView) -> bool:
    """A data batch of a transaction its ABORT marker closed."""
    return (
        batch.is_transactional
        and not batch.is_control
        and any(
            t.producer_id == batch.producer_id
            and t.first_offset <= batch.base_offset < t.last_offset
            for t in task.aborted_txns
        )
    )


def _retained(
    task: CleaningTask, batch: BatchView, record: KeyedRecord, offset_map: OffsetMap
) -> bool:
    """Kafka's rule: the last record of each key, a tombstone only until its horizon."""
    offset = batch.base_offset + record.offset_delta
    if offset > offset_map.latest_offset:
        return True
    if record.key is None:
        return False  # a compacted topic keeps records by key
    if offset < offset_map.get(record.key):
        return False  # a later record of the key supersedes it
    horizon = batch.delete_horizon_ms
    return not record.is_tombstone or horizon is None or task.now_ms < horizon
