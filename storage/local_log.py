"""`LocalLog`: the segments of one partition's log on local disk (Kafka's `LocalLog`).

It keeps the ordered list of `LogSegment`s, appends to the active (last) one, rolls,
reads across segments, truncates, removes segments (renamed `.deleted`, their files
unlinked later off the event loop: `delete_segment_files`) and swaps cleaned ones in.
What the records mean (producer state, epochs, watermarks, retention) is `Log`'s.

Invariants: segments are ordered by base offset and contiguous (a cleaned segment ends
where the ones it replaced ended); only the active segment is appended to; there is
always at least one segment. Not shared between tasks.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from tierbroker.protocol.records import BatchView
from tierbroker.storage import segment_swap
from tierbroker.storage.file_cache import LogFileCache
from tierbroker.storage.leader_epoch import LeaderEpochCache
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_loader import LogLoader
from tierbroker.storage.log_offset_metadata import LogOffsetMetadata
from tierbroker.storage.segment import FileSlice, LogSegment, file_name
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.storage.transaction_index import AbortedTxn

log = logging.getLogger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class LocalLog:
    def __init__(
        self,
        directory: Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        file_cache: LogFileCache,
    ) -> None:
        self.dir = directory
        self.topic_partition = topic_partition
        self.config = config
        self.file_cache = file_cache
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.deleted_segments: list[tuple[int, LogSegment]] = []  # (removed at ms, segment)

    # Loading -------------------------------------------------------------------------

    def new_segment(self, base_offset: int, created_ms: int | None = None) -> LogSegment:
        return LogSegment(
            self.dir,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            created_ms=now_ms() if created_ms is None else created_ms,
            file_cache=self.file_cache,
        )

    def load(
        self,
        recovery_point: int,
        had_clean_shutdown: bool,
        log_start_offset: int,
        leader_epoch_cache: LeaderEpochCache,
    ) -> None:
        loader = LogLoader(
            self.dir,
            self.topic_partition,
            recovery_point=recovery_point,
            had_clean_shutdown=had_clean_shutdown,
            leader_epoch_cache=leader_epoch_cache,
            new_segment=self.new_segment,
        )
        for segment in loader.load(log_start_offset):
            self._add(segment)

    def _add(self, segment: LogSegment) -> None:
        self.segments.append(segment)
        self._bases.append(segment.base_offset)

    # Offsets -------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active_segment.next_offset

    @property
    def log_end_offset_metadata(self) -> LogOffsetMetadata:
        active = self.active_segment
        return LogOffsetMetadata(
            message_offset=self.log_end_offset,
            segment_base_offset=active.base_offset,
            relative_position_in_segment=active.size,
        )

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def segment_index(self, offset: int) -> int:
        """The position in `segments` of the segment holding `offset` (the first below it)."""
        return max(0, bisect.bisect_right(self._bases, offset) - 1)

    def position_of(self, offset: int) -> tuple[LogSegment, int]:
        """The segment holding `offset` and the position where its batch starts (end if LEO)."""
        if offset >= self.log_end_offset:
            return self.active_segment, self.active_segment.size
        segment = self.segments[self.segment_index(offset)]
        location = segment.translate_offset(offset)
        return segment, location.position if location else segment.size

    # Appends and rolls ---------------------------------------------------------------

    def append(self, batches: list[BatchView], data: bytes | bytearray | memoryview) -> None:
        self.active_segment.append(batches, data)

    def should_roll(self, size: int, max_timestamp: int) -> bool:
        """An append of `size` bytes up to `max_timestamp` goes to a new segment: the
        active one is full (bytes or an index), or older than `segment.ms` by its first
        record's timestamp (its creation time without one)."""
        segment = self.active_segment
        if segment.is_empty:
            return False
        first_ts = segment.first_batch_timestamp
        age = (
            now_ms() - segment.created_ms
            if first_ts is None or first_ts < 0
            else max_timestamp - first_ts
        )
        return (
            segment.is_full_for(size, self.config.segment_bytes)
            or age >= self.config.segment_ms
            or segment.offset_index.is_full
            or segment.time_index.is_full
        )

    def roll(self) -> LogSegment:
        """Close the active segment for appends and start a new one at the log end offset;
        the closed one (the active one itself if empty: nothing to roll)."""
        old = self.active_segment
        if old.is_empty:
            return old
        old.on_become_inactive()
        self._add(self._create_segment(self.log_end_offset))
        return old

    def _create_segment(self, base_offset: int) -> LogSegment:
        """A new empty segment; if creating its files fails (ENOSPC), none of them is left."""
        try:
            return self.new_segment(base_offset)
        except OSError:
            for suffix in (".log", ".index", ".timeindex"):
                (self.dir / file_name(base_offset, suffix)).unlink(missing_ok=True)
            raise

    # Reads ---------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        end: tuple[LogSegment, int],
        min_one_batch: bool,
    ) -> tuple[LogSegment, FileSlice] | None:
        """Batches from `offset` up to `end` (a segment and a position in it), in the first
        segment that has any; with the segment they are in."""
        end_segment, end_position = end
        for segment in self.segments[self.segment_index(offset) :]:
            limit = end_position if segment is end_segment else segment.size
            records = segment.read(offset, max_bytes, limit, min_one_batch)
            if records is not None:
                return segment, records
            if segment is end_segment:
                return None
        return None

    def collect_aborted_txns(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [fetch_offset, upper_bound), from the segment
        holding `fetch_offset` on (Kafka's collectAbortedTransactions)."""
        aborted: list[AbortedTxn] = []
        for segment in self.segments[self.segment_index(fetch_offset) :]:
            found = segment.txn_index.collect(fetch_offset, upper_bound)
            aborted += found.aborted
            if found.complete:
                break
        return aborted

    # Truncation and removal ----------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove everything at and above `offset`, which lies in the local log; the batch
        holding it goes whole, as in Kafka."""
        while len(self.segments) > 1 and self.active_segment.base_offset >= offset:
            self.remove_segments([self.segments[-1]])
        self.active_segment.truncate_to(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.remove_segments(list(self.segments))
        self._add(self.new_segment(offset))

    def remove_segments(self, segments: list[LogSegment]) -> None:
        """Rename segment files to `.deleted`; `take_deleted` hands them over for removal
        after file.delete.delay.ms (in a worker: `delete_segment_files`)."""
        for segment in segments:
            i = self.segments.index(segment)
            del self.segments[i]
            del self._bases[i]
            segment.rename_to_deleted()
            self.deleted_segments.append((now_ms(), segment))

    def take_deleted(self, older_than_ms: int) -> list[LogSegment]:
        """Forget the segments removed at or before `older_than_ms` and return them, for
        `delete_segment_files` to unlink off the event loop."""
        taken = [
            segment for removed_ms, segment in self.deleted_segments if removed_ms <= older_than_ms
        ]
        self.deleted_segments = [
            (removed_ms, segment)
            for removed_ms, segment in self.deleted_segments
            if removed_ms > older_than_ms
        ]
        return taken

    def replace_segments(
        self, base_offset: int, replaced: Sequence[LogSegment], sizes: Sequence[int]
    ) -> LogSegment | None:
        """Swap in the cleaned segment at `base_offset` (its `.cleaned` files written) for
        `replaced`, crash-safe (`segment_swap`); None, its files removed, if `replaced`
        are no longer consecutive rolled segments of these `sizes` (a truncation or
        retention came between)."""
        first = self.segment_index(replaced[0].base_offset)
        current = self.segments[first : first + len(replaced)]
        if (
            len(current) != len(replaced)
            or any(a is not b for a, b in zip(current, replaced, strict=True))
            or [s.size for s in current] != list(sizes)
            or replaced[-1] is self.active_segment
        ):
            segment_swap.discard(self.dir, base_offset)
            return None
        segment_swap.commit(self.dir, base_offset)
        for old in replaced:
            old.rename_to_deleted()
            self.deleted_segments.append((now_ms(), old))
        segment_swap.finish(self.dir, base_offset)
        cleaned = self.new_segment(base_offset, replaced[-1].created_ms)
        cleaned.load_state()
        self.segments[first : first + len(replaced)] = [cleaned]
        self._bases[first : first + len(replaced)] = [base_offset]
        return cleaned

    # Lifecycle -----------------------------------------------------------------------

    def segments_to_flush(self, recovery_point: int, up_to_offset: int) -> list[LogSegment]:
        """The segments holding offsets between `recovery_point` and `up_to_offset`."""
        if up_to_offset <= recovery_point:
            return []
        start = self.segment_index(recovery_point)
        return [s for s in self.segments[start:] if s.base_offset < up_to_offset]

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        delete_segment_files(self.take_deleted(older_than_ms=now_ms() + 1))


def delete_segment_files(segments: list[LogSegment]) -> None:
    """Unlink the `.deleted` files of removed segments and close them: the slow part of
    retention, for a worker thread. A failure is logged; the next load removes the rest."""
    for segment in segments:
        try:
            segment.delete_files()
        except OSError as e:
            log.error("%s: not deleted (removed at the next start): %s", segment.log_path, e)
