"""`TransactionIndex`: the aborted transactions whose ABORT marker lies in one segment
(Kafka's `TransactionIndex` and `AbortedTxn`), in `<base>.txnindex`.

Each entry is 34 bytes, big-endian, no file header::

    version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64
    | lastStableOffset int64

`lastOffset` is the marker's offset; entries are in increasing `lastOffset`.
`lastStableOffset` is the log's LSO once the marker was written: an entry whose LSO
is at or past a fetch's upper bound proves that no later marker concerns that fetch.
The file is created with its first entry; its entries are read once and kept. Not
shared between tasks.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from tierbroker.storage.file_io import fsync_if_exists, write_fully

_ENTRY = struct.Struct(">hqqqq")
ENTRY_BYTES = _ENTRY.size
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        return _ENTRY.pack(
            _VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


@dataclass(frozen=True, slots=True)
class TxnIndexSearchResult:
    aborted: list[AbortedTxn]
    complete: bool  # an entry proved no later segment holds a marker for the range


def parse_entries(data: bytes) -> list[AbortedTxn]:
    """The entries of a transaction index's bytes (a torn last entry is dropped)."""
    whole = len(data) - len(data) % ENTRY_BYTES
    return [
        AbortedTxn(pid, first, last, lso)
        for _, pid, first, last, lso in _ENTRY.iter_unpack(data[:whole])
    ]


def collect_aborted(
    entries: list[AbortedTxn], fetch_offset: int, upper_bound: int
) -> TxnIndexSearchResult:
    """The entries that overlap [fetch_offset, upper_bound), stopping at the first whose
    LSO reaches `upper_bound` (Kafka's `collectAbortedTxns`)."""
    found = []
    for entry in entries:
        if entry.last_offset >= fetch_offset and entry.first_offset < upper_bound:
            found.append(entry)
        if entry.last_stable_offset >= upper_bound:
            return TxnIndexSearchResult(found, True)
    return TxnIndexSearchResult(found, False)


class TransactionIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[AbortedTxn] | None = None  # read on first use

    @property
    def entries(self) -> list[AbortedTxn]:
        if self._entries is None:
            try:
                self._entries = parse_entries(self.path.read_bytes())
            except FileNotFoundError:
                self._entries = []
        return self._entries

    def append(self, entry: AbortedTxn) -> None:
        """Add an entry; all or nothing (a failed write is cut off and raised)."""
        entries = self.entries
        if entries and entry.last_offset <= entries[-1].last_offset:
            raise ValueError(
                f"{self.path}: marker offset {entry.last_offset} is not above "
                f"{entries[-1].last_offset}"
            )
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                write_fully(fd, entry.to_bytes())
            except OSError:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        entries.append(entry)

    def collect(self, fetch_offset: int, upper_bound: int) -> TxnIndexSearchResult:
        return collect_aborted(self.entries, fetch_offset, upper_bound)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after `offset`."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) == len(self.entries):
            return
        self._rewrite(kept)

    def reset(self) -> None:
        """Drop every entry (the segment is being recovered: they are written again)."""
        self._rewrite([])

    def _rewrite(self, entries: list[AbortedTxn]) -> None:
        if not entries:
            self.path.unlink(missing_ok=True)
        else:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, len(entries) * ENTRY_BYTES)
            finally:
                os.close(fd)
        self._entries = entries

    def flush(self) -> None:
        fsync_if_exists(self.path)

    def rename(self, path: Path) -> None:
        try:
            os.rename(self.path, path)
        except FileNotFoundError:
            pass  # no entries: nothing on disk
        self.path = path

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
        self._entries = []
