"""The sparse indexes of a log segment: `OffsetIndex` and `TimeIndex`.

Both are append-only files of fixed-size big-endian entries, mirrored in memory
for lookups:

- `.index`: 8 bytes per entry, (offset - base offset) int32, position int32;
- `.timeindex`: 12 bytes per entry, timestamp int64, (offset - base offset) int32.

Invariant: offsets, positions and timestamps strictly increase along a file. After
a crash an index may lack its last entries or hold a torn one; the segment's
recovery rebuilds both from the log, so a damaged index is never trusted. Not
shared between tasks: the owning log serialises access.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path

from storage.file_io import write_fully


class _IndexFile:
    """An append-only file of fixed-size entries; entries also kept as parallel lists."""

    entry: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // self.entry.size)
        self.keys: list[int] = []
        self.values: list[int] = []
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        whole = len(data) - len(data) % self.entry.size
        for a, b in self.entry.iter_unpack(data[:whole]):
            self._load(a, b)
        if whole != len(data):
            os.ftruncate(self._fd, whole)

    def _load(self, a: int, b: int) -> None:
        raise NotImplementedError

    @property
    def entries(self) -> int:
        return len(self.keys)

    @property
    def is_full(self) -> bool:
        return len(self.keys) >= self.max_entries

    @property
    def size_in_bytes(self) -> int:
        return len(self.keys) * self.entry.size

    def _append(self, key: int, value: int, raw: bytes) -> None:
        # The entry reaches the file whole or not at all (cut back on an error).
        size = self.size_in_bytes
        try:
            write_fully(self._fd, raw)
        except OSError:
            os.ftruncate(self._fd, size)
            raise
        self.keys.append(key)
        self.values.append(value)

    def truncate_entries(self, count: int) -> None:
        """Keep only the first `count` entries."""
        del self.keys[count:]
        del self.values[count:]
        os.ftruncate(self._fd, count * self.entry.size)

    def reset(self) -> None:
        self.truncate_entries(0)

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        os.rename(self.path, path)
        self.path = path


class OffsetIndex(_IndexFile):
    """Maps offsets to file positions; keys are absolute offsets, values positions."""

    entry = struct.Struct(">ii")

    def _load(self, a: int, b: int) -> None:
        self.keys.append(self.base_offset + a)
        self.values.append(b)

    def append(self, offset: int, position: int) -> None:
        if self.keys and (offset <= self.keys[-1] or position <= self.values[-1]):
            raise ValueError(
                f"{self.path}: entry ({offset}, {position}) not above last "
                f"({self.keys[-1]}, {self.values[-1]})"
            )
        self._append(offset, position, self.entry.pack(offset - self.base_offset, position))

    def lookup(self, offset: int) -> tuple[int, int]:
        """The largest entry with offset <= `offset`, or (base offset, 0)."""
        i = bisect.bisect_right(self.keys, offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.keys[i], self.values[i]

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= `offset`."""
        self.truncate_entries(bisect.bisect_left(self.keys, offset))

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or past `position`."""
        self.truncate_entries(bisect.bisect_left(self.values, position))

    @property
    def last_offset(self) -> int:
        return self.keys[-1] if self.keys else self.base_offset


class TimeIndex(_IndexFile):
    """Maps timestamps to offsets; keys are timestamps, values absolute offsets."""

    entry = struct.Struct(">qi")

    def _load(self, a: int, b: int) -> None:
        self.keys.append(a)
        self.values.append(self.base_offset + b)

    def maybe_append(self, timestamp_ms: int, offset: int) -> None:
        """Add an entry if the timestamp is above the last one (offsets must increase too)."""
        if self.keys and (timestamp_ms <= self.keys[-1] or offset <= self.values[-1]):
            return
        self._append(timestamp_ms, offset, self.entry.pack(timestamp_ms, offset - self.base_offset))

    def lookup(self, timestamp_ms: int) -> tuple[int, int]:
        """The largest entry with timestamp <= `timestamp_ms`, or (-1, base offset)."""
        i = bisect.bisect_right(self.keys, timestamp_ms) - 1
        if i < 0:
            return -1, self.base_offset
        return self.keys[i], self.values[i]

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= `offset`."""
        self.truncate_entries(bisect.bisect_left(self.values, offset))

    @property
    def last_entry(self) -> tuple[int, int]:
        return (self.keys[-1], self.values[-1]) if self.keys else (-1, self.base_offset)
