"""`LeaderEpochCache`: the start offset of each leader epoch of a partition.

Entries (epoch, start offset) strictly increase in both fields. It answers
OffsetsForLeaderEpoch: the end offset of an epoch is the start offset of the next
higher epoch, or the log end offset for the latest. Persisted to
`leader-epoch-checkpoint` on every change (rare: once per leader change) through a
`CheckpointWriter`: the entries held answer at once, the file follows in a worker
thread (temp file, fsync, rename), so a failover of many partitions does not fsync
on the event loop (as Kafka flushes it asynchronously, KAFKA-15046).

Crash behaviour: the file lags the entries held by at most the writes in flight.
What must be durable before what: an entry is in the file before the log's recovery
point passes its start offset (`flush`, called by the segment flush before the
recovery point moves); entries starting above the recovery point are rebuilt at
load from the batches that recovery re-reads (as Kafka's `LogSegment.recover`). So
after a crash the entries cover every batch the log keeps, and `truncate_from_end`
trims entries the log lost. That trim at load, and the entries recovery rebuilds,
are written by the next change or `assign` (the broker assigns every log it leads
before serving): a crash before then loads the same state again. Not shared between
tasks: the owning log serialises access; only `flush` may run in a worker thread.
"""

from __future__ import annotations

import bisect
import itertools
from pathlib import Path

from tierbroker.storage.checkpoints import (
    CheckpointWriter,
    format_epoch_entries,
    read_epoch_entries,
)

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries = read_epoch_entries(path)
        self._written = list(self._entries)  # what the file holds or the writer will write
        self.writer = CheckpointWriter(path)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, *, flush: bool = True) -> None:
        """Record that `epoch` starts at `start_offset` (no-op unless it is a new, higher
        epoch); `flush=False` (recovery at load) leaves the write to the next change."""
        if self._entries and epoch <= self._entries[-1][0]:
            if flush:
                self._replace(self._entries)  # a change deferred at load is written now
            return
        # Entries of older epochs starting at or after this offset were never written.
        kept = [e for e in self._entries if e[1] < start_offset]
        if flush:
            self._replace([*kept, (epoch, start_offset)])
        else:
            self._entries = [*kept, (epoch, start_offset)]

    def restore(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry with `entries`, in one write (a log rebuilt from the remote
        tier's checkpoint); ValueError unless epochs and start offsets strictly increase."""
        check_increasing(entries, str(self.path))
        self._replace(list(entries))

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= `epoch`, its end offset), as OffsetsForLeaderEpoch answers.

        An epoch above every known one is undefined; one below the first is answered
        with the first epoch's start offset, so a follower truncates there.
        """
        if epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self._entries[-1][0]:
            return epoch, log_end_offset
        higher = bisect.bisect_right(self._entries, (epoch, float("inf")))
        if higher == len(self._entries):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return epoch, self._entries[0][1]
        return self._entries[higher - 1][0], self._entries[higher][1]

    def epoch_for_offset(self, offset: int) -> int:
        i = bisect.bisect_right([start for _, start in self._entries], offset) - 1
        return self._entries[i][0] if i >= 0 else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int, *, flush: bool = True) -> None:
        """Drop epochs that start at or after `end_offset` (the log was truncated there);
        `flush=False` (loading) leaves the write to the next change."""
        kept = [e for e in self._entries if e[1] < end_offset]
        if kept != self._entries:
            if flush:
                self._replace(kept)
            else:
                self._entries = kept

    def truncate_from_start(self, start_offset: int) -> None:
        """Move the first kept epoch's start to `start_offset` (the log start moved)."""
        i = bisect.bisect_right([start for _, start in self._entries], start_offset) - 1
        if i <= 0 and (not self._entries or self._entries[0][1] >= start_offset):
            return
        kept = self._entries[i:]
        kept[0] = (kept[0][0], start_offset)
        self._replace(kept)

    def clear(self) -> None:
        self._replace([])

    def flush(self) -> None:
        """Make the entries submitted so far durable, in the calling thread (a worker's
        segment flush, or close); raises the OSError of a failed write."""
        self.writer.flush()

    def _replace(self, entries: list[tuple[int, int]]) -> None:
        """Hold `entries`, and have them written unless the file has or gets them already."""
        if entries != self._written:
            self.writer.submit(format_epoch_entries(entries))
            self._written = list(entries)
        self._entries = entries


def check_increasing(entries: list[tuple[int, int]], source: str) -> None:
    """ValueError, naming `source`, unless epochs and start offsets strictly increase."""
    for (epoch, start), (next_epoch, next_start) in itertools.pairwise(entries):
        if next_epoch <= epoch or next_start <= start:
            raise ValueError(
                f"{source}: epoch entries ({epoch}, {start}), ({next_epoch}, {next_start}) "
                "do not increase"
            )
