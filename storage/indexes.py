"""The sparse indexes of a log segment: `OffsetIndex` and `TimeIndex`, and their reader.

Both are append-only files of fixed-size big-endian entries:

- `.index`: 8 bytes per entry, (offset - base offset) int32, position int32;
- `.timeindex`: 12 bytes per entry, timestamp int64, (offset - base offset) int32.

`OffsetEntries` and `TimeEntries` read such entries in place, in the file's own
bytes, with a binary search over fixed-size entries (as Kafka's memory-mapped
indexes do): an index costs its file size in memory, not a Python int per field.
Every reader of index bytes (local segments, the remote index cache, the
pipeline) uses them.

Invariant: offsets, positions and timestamps strictly increase along a file. After
a crash an index may lack its last entries or hold a torn one; the segment's
recovery rebuilds both from the log, so a damaged index is never trusted. Index
files are read when a lookup first needs them (a cleanly shut down segment's
index is never read just to load the log) and hold no open file between calls.
Not shared between tasks: the owning log serialises access.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from tierbroker.storage.file_io import write_fully


class IndexEntries:
    """Fixed-size entries of one index, searched in place; keys and values absolute."""

    __slots__ = ("base_offset", "data")
    entry: struct.Struct

    def __init__(self, data: bytes | bytearray, base_offset: int) -> None:
        self.data = data
        self.base_offset = base_offset

    def __len__(self) -> int:
        return len(self.data) // self.entry.size

    def __getitem__(self, i: int) -> tuple[int, int]:
        """(key, value) of entry `i` (negative counts from the end)."""
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._decode(*self.entry.unpack_from(self.data, i * self.entry.size))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for i in range(len(self)):
            yield self[i]

    def _decode(self, a: int, b: int) -> tuple[int, int]:
        raise NotImplementedError

    def key(self, i: int) -> int:
        return self[i][0]

    def value(self, i: int) -> int:
        return self[i][1]

    def floor(self, key: int) -> int:
        """The position of the last entry with key <= `key`, or -1."""
        return bisect.bisect_right(range(len(self)), key, key=self.key) - 1

    def count_keys_below(self, key: int) -> int:
        return bisect.bisect_left(range(len(self)), key, key=self.key)

    def count_values_below(self, value: int) -> int:
        return bisect.bisect_left(range(len(self)), value, key=self.value)

    def increasing(self) -> Self:
        """The leading entries that strictly increase in key and value: an index file
        read whole may end in a preallocated, zeroed tail."""
        for i in range(1, len(self)):
            (k0, v0), (k1, v1) = self[i - 1], self[i]
            if k1 <= k0 or v1 <= v0:
                return type(self)(self.data[: i * self.entry.size], self.base_offset)
        return self


class OffsetEntries(IndexEntries):
    """`.index` entries: (absolute offset, file position)."""

    __slots__ = ()
    entry = struct.Struct(">ii")

    def _decode(self, a: int, b: int) -> tuple[int, int]:
        return self.base_offset + a, b

    def encode(self, offset: int, position: int) -> bytes:
        return self.entry.pack(offset - self.base_offset, position)

    def position_for(self, offset: int) -> int:
        """The position of the last entry at or before `offset` (0 if none)."""
        i = self.floor(offset)
        return self.value(i) if i >= 0 else 0


class TimeEntries(IndexEntries):
    """`.timeindex` entries: (timestamp, absolute offset)."""

    __slots__ = ()
    entry = struct.Struct(">qi")

    def _decode(self, a: int, b: int) -> tuple[int, int]:
        return a, self.base_offset + b

    def encode(self, timestamp_ms: int, offset: int) -> bytes:
        return self.entry.pack(timestamp_ms, offset - self.base_offset)


class _IndexFile:
    """An append-only index file, read into one bytearray when a lookup first needs it."""

    reader: type[IndexEntries]

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entry_size = self.reader.entry.size
        self.max_entries = max(1, max_index_bytes // self.entry_size)
        self._loaded: IndexEntries | None = None
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = 0  # created by the first append
        self._file_entries = size // self.entry_size
        if self._file_entries == 0:
            if size:
                os.truncate(path, 0)  # a torn first entry: appends must start at 0
            self._loaded = self.reader(bytearray(), base_offset)

    def _entries(self) -> IndexEntries:
        """The entries, read from the file on first use; a torn last entry is cut off."""
        if self._loaded is None:
            fd = os.open(self.path, os.O_RDWR)
            try:
                data = bytearray(os.pread(fd, os.fstat(fd).st_size, 0))
                whole = len(data) - len(data) % self.entry_size
                if whole != len(data):
                    del data[whole:]
                    os.ftruncate(fd, whole)
            finally:
                os.close(fd)
            self._loaded = self.reader(data, self.base_offset)
        return self._loaded

    def _last(self) -> tuple[int, int] | None:
        """The last entry, read alone if the index is not loaded (segment loading)."""
        if self._loaded is not None:
            return self._loaded[-1] if self._loaded.data else None
        fd = os.open(self.path, os.O_RDONLY)
        try:
            last = os.pread(fd, self.entry_size, (self._file_entries - 1) * self.entry_size)
        finally:
            os.close(fd)
        return self.reader(last, self.base_offset)[0]

    @property
    def entries(self) -> int:
        return self._file_entries if self._loaded is None else len(self._loaded)

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def memory_bytes(self) -> int:
        """Bytes of the in-memory copy (0 until a lookup loads it)."""
        return 0 if self._loaded is None else len(self._loaded.data)

    def _append(self, raw: bytes) -> None:
        data = self._entries().data
        assert isinstance(data, bytearray)
        size = len(data)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # The entry reaches the file whole or not at all (cut back on an error).
            try:
                write_fully(fd, raw)
            except OSError:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        data += raw

    def truncate_entries(self, count: int) -> None:
        """Keep only the first `count` entries (none: the file is not read first)."""
        if count == 0:
            self._loaded = self.reader(bytearray(), self.base_offset)
        else:
            data = self._entries().data
            assert isinstance(data, bytearray)
            del data[count * self.entry_size :]
        try:
            os.truncate(self.path, count * self.entry_size)
        except FileNotFoundError:
            if count:
                raise

    def reset(self) -> None:
        self.truncate_entries(0)

    def flush(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # never appended to
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Drop the in-memory copy; a later lookup reads the file again."""
        if self._loaded is not None and self._loaded.data:
            self._file_entries = len(self._loaded)
            self._loaded = None

    def delete(self) -> None:
        """Remove the file; lookups keep the entries in memory (or none: the segment's
        reads then scan from its start), so a deleted segment stays readable."""
        if self._loaded is None:
            self._loaded = self.reader(bytearray(), self.base_offset)
        self.path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        os.rename(self.path, path)
        self.path = path


class OffsetIndex(_IndexFile):
    """Maps offsets to file positions."""

    reader = OffsetEntries

    def append(self, offset: int, position: int) -> None:
        entries = self._entries()
        assert isinstance(entries, OffsetEntries)
        if entries.data and (offset <= entries[-1][0] or position <= entries[-1][1]):
            raise ValueError(
                f"{self.path}: entry ({offset}, {position}) not above last {entries[-1]}"
            )
        self._append(entries.encode(offset, position))

    def lookup(self, offset: int) -> tuple[int, int]:
        """The largest entry with offset <= `offset`, or (base offset, 0)."""
        entries = self._entries()
        i = entries.floor(offset)
        return entries[i] if i >= 0 else (self.base_offset, 0)

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= `offset`."""
        self.truncate_entries(self._entries().count_keys_below(offset))

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or past `position`."""
        self.truncate_entries(self._entries().count_values_below(position))

    @property
    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base offset, 0)."""
        return self._last() or (self.base_offset, 0)


class TimeIndex(_IndexFile):
    """Maps timestamps to offsets."""

    reader = TimeEntries

    def maybe_append(self, timestamp_ms: int, offset: int) -> None:
        """Add an entry if the timestamp is above the last one (offsets must increase too)."""
        entries = self._entries()
        assert isinstance(entries, TimeEntries)
        if entries.data and (timestamp_ms <= entries[-1][0] or offset <= entries[-1][1]):
            return
        self._append(entries.encode(timestamp_ms, offset))

    def lookup(self, timestamp_ms: int) -> tuple[int, int]:
        """The largest entry with timestamp <= `timestamp_ms`, or (-1, base offset)."""
        entries = self._entries()
        i = entries.floor(timestamp_ms)
        return entries[i] if i >= 0 else (-1, self.base_offset)

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= `offset`."""
        self.truncate_entries(self._entries().count_values_below(offset))

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset)."""
        return self._last() or (-1, self.base_offset)
