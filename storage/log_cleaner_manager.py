"""`LogCleanerManager`: which compacted log the cleaner takes next, and how far each is
clean (Kafka's `LogCleanerManager`).

Each log dir keeps `cleaner-offset-checkpoint`: per partition, its first dirty offset
(everything below it was cleaned), written atomically after each pass. A checkpoint
outside [log start, log end] (retention passed it) is taken as the log start: the
whole log is dirty again; one above an offset the log was truncated to comes down to
it.

A log's cleanable range is [first dirty, first uncleanable): first uncleanable is the
base of the first segment that is active, holds offsets at or above the high watermark
(not yet on every in-sync replica), or holds records newer than
`min.compaction.lag.ms`. The log whose cleanable bytes are the largest share of it
is cleaned next, if that share passes `min.cleanable.dirty.ratio`, or at once if its
oldest dirty record is older than `max.compaction.lag.ms`. A log being cleaned is
not taken twice; a log a pass failed on is uncleanable until the broker restarts.
Not shared between tasks: the event loop calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tierbroker.storage.checkpoints import OffsetCheckpointFile
from tierbroker.storage.log import Log
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"


@dataclass(frozen=True, slots=True)
class LogToClean:
    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool  # max.compaction.lag.ms passed

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


class LogCleanerManager:
    def __init__(self, log_dirs: Iterable[Path]) -> None:
        self.checkpoints: dict[Path, dict[TopicPartition, int]] = {}
        for log_dir in log_dirs:
            path = log_dir / CLEANER_CHECKPOINT
            try:
                self.checkpoints[log_dir] = OffsetCheckpointFile(path).read()
            except (OSError, ValueError) as e:  # cleaned again from the start: slower, not wrong
                log.warning("%s unreadable, its logs are dirty again: %s", path, e)
                self.checkpoints[log_dir] = {}
        self.in_progress: set[TopicPartition] = set()
        self.uncleanable: dict[Path, set[TopicPartition]] = {}
        self.max_dirty_ratio = 0.0  # of the last choice, for max-dirty-percent

    def cleanable(self, lg: Log, now_ms: int) -> LogToClean:
        """`lg`'s clean and cleanable bytes, as things stand."""
        entries = self.checkpoints.setdefault(lg.dir.parent, {})
        truncated = lg.take_lowest_truncation()
        if truncated is not None and entries.get(lg.topic_partition, -1) > truncated:
            entries[lg.topic_partition] = truncated  # Kafka's maybeTruncateCheckpoint
        checkpoint = entries.get(lg.topic_partition, -1)
        first_dirty = (
            checkpoint
            if lg.log_start_offset <= checkpoint <= lg.log_end_offset
            else lg.log_start_offset
        )
        segments = lg.segments
        first = next(
            (i for i, s in enumerate(segments) if s.next_offset > first_dirty), len(segments) - 1
        )
        clean_bytes = sum(s.size for s in segments[:first])
        lag_bound = now_ms - lg.config.min_compaction_lag_ms
        cleanable_bytes = 0
        first_uncleanable = lg.active_segment.base_offset
        for segment in segments[first:-1]:
            # Nothing undecided or unreplicated is cleaned: the LSO is at most the HW.
            if segment.next_offset > lg.last_stable_offset or segment.max_timestamp > lag_bound:
                first_uncleanable = segment.base_offset
                break
            cleanable_bytes += segment.size
        oldest = segments[first].first_batch_timestamp
        overdue = (
            oldest is not None
            and oldest >= 0
            and oldest < now_ms - lg.config.max_compaction_lag_ms
            and cleanable_bytes > 0
        )
        return LogToClean(lg, first_dirty, first_uncleanable, clean_bytes, cleanable_bytes, overdue)

    def grab_filthiest(self, logs: Iterable[Log], now_ms: int) -> LogToClean | None:
        """The log to clean now, marked in progress; None if none needs it."""
        candidates = [
            self.cleanable(lg, now_ms)
            for lg in logs
            if lg.config.compact
            # A tiered log is never cleaned, as in Kafka: its segments are copied as they
            # are (it can only be compacted through a dynamic log.cleanup.policy).
            and not lg.config.remote_storage_enable
            and lg.topic_partition not in self.in_progress
            and lg.topic_partition not in self.uncleanable.get(lg.dir.parent, ())
        ]
        self.max_dirty_ratio = max((c.cleanable_ratio for c in candidates), default=0.0)
        eligible = [
            c
            for c in candidates
            if c.cleanable_bytes > 0
            and (
                c.needs_compaction_now or c.cleanable_ratio > c.log.config.min_cleanable_dirty_ratio
            )
        ]
        if not eligible:
            return None
        chosen = max(eligible, key=lambda c: (c.needs_compaction_now, c.cleanable_ratio))
        self.in_progress.add(chosen.log.topic_partition)
        return chosen

    def done_cleaning(self, lg: Log, end_offset: int | None) -> dict[TopicPartition, int] | None:
        """The pass over `lg` ended; with `end_offset` (it swapped its segments in), the
        log dir's checkpoint entries to write."""
        self.in_progress.discard(lg.topic_partition)
        if end_offset is None:
            return None
        entries = self.checkpoints.setdefault(lg.dir.parent, {})
        entries[lg.topic_partition] = end_offset
        return dict(entries)

    def mark_uncleanable(self, lg: Log) -> None:
        self.in_progress.discard(lg.topic_partition)
        self.uncleanable.setdefault(lg.dir.parent, set()).add(lg.topic_partition)

    def forget(self, live: Iterable[TopicPartition]) -> None:
        """Drop the checkpoints of logs no longer here (deleted or moved away)."""
        keep = set(live)
        for entries in self.checkpoints.values():
            for tp in [tp for tp in entries if tp not in keep]:
                del entries[tp]
