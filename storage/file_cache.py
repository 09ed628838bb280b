"""`LogFileCache`: a log manager's open `.log` files, bounded by the process's file limit.

A segment opens its file through the cache when it reads or appends, so a broker
with more segments than `RLIMIT_NOFILE` allows keeps only the recently used ones
open. The least recently used file beyond the capacity is forgotten by the cache;
its descriptor is closed once nothing refers to it any more. A `FileSlice` that a
fetch response is still sending holds its `LogFile`, so eviction never closes a
file under `sendfile`; a deleted segment holds its own until
`file.delete.delay.ms` has passed. Files held that way count too: past
`max_open_files`, a read copies its bytes instead of holding the file
(`under_pressure`), so one fetch of thousands of partitions cannot exhaust the
file limit.

Each `LogManager` has its own (a log outside one, in a tool or a test, has its own
too), so brokers of different clusters in one process, on different threads, share
none. Not thread-safe: one thread uses it at a time, the loader before the broker
serves and then the event loop (flushes and log creation in worker threads open their
paths themselves).
"""

from __future__ import annotations

import io
import os
import resource
from collections import OrderedDict
from pathlib import Path

MIN_OPEN_LOG_FILES = 16
OPEN_LOG_FILES_SHARE = 0.5  # of the soft RLIMIT_NOFILE; sockets and indexes need the rest
HELD_LOG_FILES_SHARE = 0.5  # of the capacity: evicted files still held by responses


def soft_file_limit() -> int:
    """The process's soft RLIMIT_NOFILE (65,536 standing for unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 16 if soft == resource.RLIM_INFINITY else soft


def log_file_capacity() -> int:
    """How many `.log` files a cache keeps open: its share of the open file limit."""
    return max(MIN_OPEN_LOG_FILES, int(soft_file_limit() * OPEN_LOG_FILES_SHARE))


def _open_for_append(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_APPEND)


class LogFile(io.FileIO):
    """A `.log` file opened for reads at any position and appends at the end.

    Closed when the last reference goes (CPython's reference counting), without the
    ResourceWarning of an unclosed file: dropping it is how the cache closes it.
    """

    def __init__(self, path: Path, cache: LogFileCache) -> None:
        # Never created here: a deleted segment's path must not come back empty.
        super().__init__(path, "r+", opener=_open_for_append)
        self._cache = cache
        cache.open_files += 1

    def close(self) -> None:
        if not self.closed:
            self._cache.open_files -= 1
        super().close()

    def __del__(self) -> None:
        self.close()


class LogFileCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._files: OrderedDict[Path, LogFile] = OrderedDict()
        self.opened = 0  # files opened since start: a measure of churn
        self.open_files = 0  # LogFiles of this cache still open, held here or not

    @property
    def max_open_files(self) -> int:
        return self.capacity + int(self.capacity * HELD_LOG_FILES_SHARE)

    @property
    def under_pressure(self) -> bool:
        """More log files are open than the budget: reads should not hold theirs."""
        return self.open_files >= self.max_open_files

    @classmethod
    def sized_from_rlimit(cls) -> LogFileCache:
        return cls(log_file_capacity())

    def __len__(self) -> int:
        return len(self._files)

    def get(self, path: Path) -> LogFile:
        """The open file at `path`, now the most recently used."""
        file = self._files.get(path)
        if file is not None:
            self._files.move_to_end(path)
            return file
        file = LogFile(path, self)
        self.opened += 1
        self._files[path] = file
        # Invariant: at most `capacity` files are held here; evicted ones close when unused.
        while len(self._files) > self.capacity:
            self._files.popitem(last=False)
        return file

    def forget(self, path: Path) -> LogFile | None:
        """Stop holding the file at `path`; returns it if it was open."""
        return self._files.pop(path, None)
