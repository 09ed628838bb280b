"""`LogSegment`: one `.log` file of record batches with its `.index`, `.timeindex` and
`.txnindex` (aborted transactions whose marker it holds, written only when there is one).

The file is a sequence of whole RecordBatch v2 batches, appended as received, with
offsets increasing; the segment's base offset is in its file name (20 digits). An
offset index entry is added every `index_interval_bytes` of appended data and a
time index entry whenever the largest timestamp grows past the last entry.

After a crash the tail may be torn or unchecked: `recover` re-reads every batch,
checks its CRC, truncates at the first bad one and rebuilds both indexes. An
append that fails (ENOSPC, EIO) is cut off again before the error is raised. The
`.log` file is opened through its log manager's `LogFileCache` when a read or an append
needs it, so a segment holds no descriptor while idle; a method that uses the file
across several calls keeps a reference to it, which keeps it open. Not safe to
share between tasks: the owning `Log` serialises appends; reads only need
positions that appends have published.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tierbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    BatchView,
    InvalidRecordError,
    Record,
    decode_batch,
)
from tierbroker.storage.file_cache import LogFile, LogFileCache
from tierbroker.storage.file_io import fsync_if_exists, write_fully
from tierbroker.storage.indexes import OffsetIndex, TimeIndex
from tierbroker.storage.leader_epoch import LeaderEpochCache
from tierbroker.storage.transaction_index import TransactionIndex

_READ_CHUNK_BYTES = 1 << 20
DELETED_SUFFIX = ".deleted"
_BATCH_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength


def file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class FileSlice:
    """`length` bytes at `position` of an open log file: what a fetch sends with sendfile."""

    file: LogFile
    position: int
    length: int

    def read(self) -> bytes:
        return os.pread(self.file.fileno(), self.length, self.position)


@dataclass(frozen=True, slots=True)
class BatchLocation:
    """A batch found in a segment: its offsets, position and size."""

    base_offset: int
    last_offset: int
    position: int
    size_in_bytes: int
    max_timestamp: int


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        created_ms: int,
        file_cache: LogFileCache,
        suffix: str = "",
    ) -> None:
        """`suffix`: after each file's name, for a segment the cleaner is writing."""
        self.base_offset = base_offset
        self.file_cache = file_cache
        self.index_interval_bytes = index_interval_bytes
        self.log_path = directory / (file_name(base_offset, ".log") + suffix)
        self._deleted_file: LogFile | None = None  # held from unlink() until close()
        self.offset_index = OffsetIndex(
            directory / (file_name(base_offset, ".index") + suffix), base_offset, max_index_bytes
        )
        self.time_index = TimeIndex(
            directory / (file_name(base_offset, ".timeindex") + suffix),
            base_offset,
            max_index_bytes,
        )
        self.txn_index = TransactionIndex(
            directory / (file_name(base_offset, ".txnindex") + suffix)
        )
        # Created here, opened only when used: a new segment holds no descriptor either.
        os.close(os.open(self.log_path, os.O_WRONLY | os.O_CREAT, 0o644))
        self.size = os.stat(self.log_path).st_size
        self.created_ms = created_ms
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp: int | None = None
        self.next_offset = base_offset  # valid after recover() or appends
        self._bytes_since_index_entry = 0

    @property
    def file(self) -> LogFile:
        """The open `.log` file (opened now if the cache had closed it)."""
        if self._deleted_file is not None:
            return self._deleted_file
        return self.file_cache.get(self.log_path)

    # Appends -------------------------------------------------------------------------

    def append(self, batches: list[BatchView], data: bytes | bytearray | memoryview) -> None:
        """Append whole batches (already validated and stamped), given also as one buffer.

        All or nothing: on an OSError (ENOSPC, EIO) the file, the indexes and the
        in-memory state are cut back to where the append started, and the error is raised.
        """
        start = position = self.size
        try:
            write_fully(self.file.fileno(), data)
            for batch in batches:
                self._index_batch(batch, position)
                position += batch.size_in_bytes
        except OSError:
            self._undo_append(start)
            raise
        self.size = position

    def _undo_append(self, position: int) -> None:
        """Cut the file and indexes back to `position`; recompute the state from the file.

        Shrinking a file needs no space, so this works on a full disk; if it fails too
        (EIO), the log dir goes offline and the recovery at the next start cuts the tail.
        A failure path only: it reads every batch header of the segment.
        """
        os.ftruncate(self.file.fileno(), position)
        self.offset_index.truncate_to_position(position)
        self._rebuild_tail_state()

    def _index_batch(self, batch: BatchView | BatchLocation, position: int) -> None:
        """Advance the in-memory state and the sparse indexes past one batch at `position`."""
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = batch.max_timestamp
        if batch.max_timestamp > self.max_timestamp:
            self.max_timestamp = batch.max_timestamp
            self.offset_of_max_timestamp = batch.last_offset
        if (
            self._bytes_since_index_entry >= self.index_interval_bytes
            or not self.offset_index.entries
        ):
            self.offset_index.append(batch.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += batch.size_in_bytes
        self.next_offset = batch.last_offset + 1

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    def is_full_for(self, size: int, segment_bytes: int) -> bool:
        return self.size > 0 and self.size + size > segment_bytes

    # Reads ---------------------------------------------------------------------------

    def headers_from(
        self, position: int, end: int | None = None
    ) -> Iterator[tuple[int, BatchView]]:
        """(file position, header view) of each batch from `position` up to `end` (or size)."""
        end = self.size if end is None else end
        file = self.file  # held while the generator runs: eviction cannot close it
        fd = file.fileno()
        while position + BATCH_HEADER_SIZE <= end:
            header = os.pread(fd, BATCH_HEADER_SIZE, position)
            if len(header) < BATCH_HEADER_SIZE:
                return
            batch = BatchView(header)
            yield position, batch
            position += batch.size_in_bytes

    def read_batch(self, position: int, size: int) -> bytes:
        """The whole batch of `size` bytes at `position` (a control batch's record)."""
        return os.pread(self.file.fileno(), size, position)

    def offset_at_position(self, position: int) -> int:
        """The base offset of the batch at `position`; the next offset at the end."""
        if position + BATCH_HEADER_SIZE > self.size:
            return self.next_offset
        return BatchView(os.pread(self.file.fileno(), BATCH_HEADER_SIZE, position)).base_offset

    def batches_from(self, position: int, end: int | None = None) -> list[BatchLocation]:
        """Locations of the batches from `position` up to `end` (or the segment's size)."""
        return [
            BatchLocation(b.base_offset, b.last_offset, pos, b.size_in_bytes, b.max_timestamp)
            for pos, b in self.headers_from(position, end)
        ]

    def translate_offset(self, offset: int, start_position: int = 0) -> BatchLocation | None:
        """The first batch whose last offset is >= `offset`, searching from the index hint."""
        _, position = self.offset_index.lookup(offset)
        position = max(position, start_position)
        file = self.file
        fd = file.fileno()
        while position + BATCH_HEADER_SIZE <= self.size:
            batch = BatchView(os.pread(fd, BATCH_HEADER_SIZE, position))
            if batch.last_offset >= offset:
                return BatchLocation(
                    batch.base_offset,
                    batch.last_offset,
                    position,
                    batch.size_in_bytes,
                    batch.max_timestamp,
                )
            position += batch.size_in_bytes
        return None

    def read(
        self, offset: int, max_bytes: int, max_position: int, min_one_batch: bool
    ) -> FileSlice | None:
        """Batches from the one holding `offset`, at most `max_bytes` (or one whole batch)
        and never past `max_position`; None if `offset` is beyond this segment."""
        start = self.translate_offset(offset)
        if start is None or start.position >= max_position:
            return None
        available = max_position - start.position
        length = min(available, max_bytes)
        if min_one_batch and length < start.size_in_bytes:
            length = min(available, start.size_in_bytes)
        if length <= 0:
            return None
        return FileSlice(self.file, start.position, length)

    def find_offset_by_timestamp(
        self, timestamp_ms: int, starting_offset: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `starting_offset` whose
        timestamp is >= `timestamp_ms`, as Kafka's searchForTimestamp; records of the
        matching batch are decoded (ListOffsets only, never on the fetch path)."""
        _, offset = self.time_index.lookup(timestamp_ms)
        _, position = self.offset_index.lookup(max(offset, starting_offset))
        for batch_position, batch in self.headers_from(position):
            if batch.max_timestamp < timestamp_ms or batch.last_offset < starting_offset:
                continue
            for record in self._records_of(batch_position, batch):
                if record.timestamp >= timestamp_ms and record.offset >= starting_offset:
                    return record.offset, record.timestamp
        return None

    def max_timestamp_record(self) -> tuple[int, int, int] | None:
        """(offset, timestamp, batch leader epoch) of the first record holding the segment's
        largest timestamp: the epoch is the batch's own, as Kafka answers ListOffsets -3."""
        if self.max_timestamp < 0:
            return None
        location = self.translate_offset(self.offset_of_max_timestamp)
        if location is None:
            return None
        header = BatchView(os.pread(self.file.fileno(), BATCH_HEADER_SIZE, location.position))
        epoch = max(header.partition_leader_epoch, -1)
        for record in self._records_of(location.position, header):
            if record.timestamp == self.max_timestamp:
                return record.offset, record.timestamp, epoch
        return location.last_offset, self.max_timestamp, epoch

    def _records_of(self, position: int, header: BatchView) -> list[Record]:
        data = os.pread(self.file.fileno(), header.size_in_bytes, position)
        return list(decode_batch(BatchView(data)).records)

    def largest_timestamp_ms(self) -> int:
        """The largest record timestamp, or the file's mtime if there is none (retention.ms)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self.file.fileno()).st_mtime * 1000)

    # Loading, recovery and truncation ---------------------------------------------------------

    def load_state(self) -> None:
        """Restore in-memory state of a cleanly closed segment from its indexes and tail."""
        batches = self.batches_from(0, min(self.size, BATCH_HEADER_SIZE))
        self.first_batch_timestamp = batches[0].max_timestamp if batches else None
        self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry
        _, position = self.offset_index.last_entry
        for batch in self.batches_from(position):
            self._index_batch(batch, batch.position)
        if self.max_timestamp < 0:
            self.offset_of_max_timestamp = -1

    def on_become_inactive(self) -> None:
        """The segment was rolled: record its final largest timestamp in the time index."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)

    def recover(self, leader_epoch_cache: LeaderEpochCache | None = None) -> int:
        """Re-read the segment, rebuild indexes, truncate at the first invalid batch;
        each valid batch's epoch goes to `leader_epoch_cache` (written by its next change).

        Returns the number of bytes truncated.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.max_timestamp = self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = None
        self.next_offset = self.base_offset
        self._bytes_since_index_entry = 0
        file = self.file
        fd = file.fileno()
        file_size = os.fstat(fd).st_size
        position = 0
        while position < file_size:
            valid = self._recover_batch(fd, position, file_size, leader_epoch_cache)
            if valid is None:
                break
            position += valid
        self.size = position
        if position < file_size:
            os.ftruncate(fd, position)
        return file_size - position

    def _recover_batch(
        self, fd: int, position: int, file_size: int, epochs: LeaderEpochCache | None
    ) -> int | None:
        if file_size - position < BATCH_HEADER_SIZE:
            return None
        _, length = _BATCH_PREFIX.unpack(os.pread(fd, 12, position))
        size = int(length) + 12
        if size < BATCH_HEADER_SIZE or position + size > file_size:
            return None
        data = os.pread(fd, size, position)
        batch = BatchView(data)
        try:
            batch.validate()
        except InvalidRecordError:
            return None
        if batch.base_offset < self.next_offset:
            return None
        self.size = position
        self._index_batch(batch, position)
        if epochs is not None and batch.partition_leader_epoch >= 0:
            epochs.assign(batch.partition_leader_epoch, batch.base_offset, flush=False)
        return size

    def truncate_to(self, offset: int) -> int:
        """Remove the batch holding `offset` and all after it, as Kafka does; returns bytes cut."""
        location = self.translate_offset(offset)
        if location is None:
            return 0
        removed = self.size - location.position
        os.ftruncate(self.file.fileno(), location.position)
        self.offset_index.truncate_to_position(location.position)
        self.txn_index.truncate_to(location.base_offset)
        self.size = location.position
        self._rebuild_tail_state()
        return removed

    def _rebuild_tail_state(self) -> None:
        """Recompute next offset, timestamps and time index after truncation."""
        batches = self.batches_from(0)
        self.next_offset = batches[-1].last_offset + 1 if batches else self.base_offset
        self.max_timestamp = self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = batches[0].max_timestamp if batches else None
        for b in batches:
            if b.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = b.max_timestamp, b.last_offset
        self.time_index.truncate_to(self.next_offset)
        self._bytes_since_index_entry = self.index_interval_bytes

    # Lifecycle -----------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the files; safe in a worker thread (it opens the paths, not the cache)."""
        if not self.log_path.exists():
            return  # deleted meanwhile: nothing left to make durable
        fsync_if_exists(self.log_path)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        """Release the file; a fetch response still sending from it keeps it open."""
        self.file_cache.forget(self.log_path)
        self._deleted_file = None
        self.offset_index.close()
        self.time_index.close()

    def unlink(self) -> None:
        """Remove the files; the open log file stays readable for fetches in flight."""
        self._deleted_file = self.file
        self.file_cache.forget(self.log_path)
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()
        self.log_path.unlink(missing_ok=True)

    def rename_to_deleted(self) -> None:
        """Rename the files with the `.deleted` suffix, as Kafka's retention does: cheap
        enough for the event loop, the segment stays readable for fetches in flight, and
        a crash leaves names the next load removes. `delete_files` removes them later."""
        self._deleted_file = self.file
        self.file_cache.forget(self.log_path)
        for index in (self.offset_index, self.time_index):
            deleted_index = index.path.with_name(index.path.name + DELETED_SUFFIX)
            try:
                index.rename(deleted_index)
            except FileNotFoundError:
                index.path = deleted_index  # never appended to: its entries are in memory
        txn_index = self.txn_index.path
        self.txn_index.rename(txn_index.with_name(txn_index.name + DELETED_SUFFIX))
        deleted_path = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX)
        os.rename(self.log_path, deleted_path)
        self.log_path = deleted_path

    def delete_files(self) -> None:
        """Unlink the renamed files and drop the held log file; for a worker thread (the
        unlink and the last close free the blocks, which takes long for a large file).
        A fetch response still sending from the file keeps it open until it is sent."""
        self.log_path.unlink(missing_ok=True)
        self.offset_index.path.unlink(missing_ok=True)
        self.time_index.path.unlink(missing_ok=True)
        self.txn_index.delete()
        self.offset_index.close()
        self.time_index.close()
        self._deleted_file = None
