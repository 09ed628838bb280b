"""`LogLoader`: the segments of a log directory as the broker finds them at start-up.

A swap of cleaned segments a stop or a crash cut short is completed or undone first
(`segment_swap`), then stale `.tmp` and `.deleted` files (a write or a retention cut
short) are removed. After an unclean shutdown, segments from the one holding
the recovery point on are re-read and cut at the first torn or corrupt batch, and
the leader epochs of their batches go back into the epoch cache; a segment missing
its offset index is re-read too. A segment after a gap (a truncated one before it)
is removed with everything after it. Runs once per log, before the log serves; not
shared between tasks.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from pathlib import Path

from tierbroker.storage import segment_swap
from tierbroker.storage.leader_epoch import LeaderEpochCache
from tierbroker.storage.segment import LogSegment
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class LogLoader:
    def __init__(
        self,
        directory: Path,
        topic_partition: TopicPartition,
        *,
        recovery_point: int,
        had_clean_shutdown: bool,
        leader_epoch_cache: LeaderEpochCache,
        new_segment: Callable[[int, int | None], LogSegment],
    ) -> None:
        self.dir = directory
        self.topic_partition = topic_partition
        self.recovery_point = recovery_point
        self.had_clean_shutdown = had_clean_shutdown
        self.leader_epoch_cache = leader_epoch_cache
        self.new_segment = new_segment

    def load(self, log_start_offset: int) -> list[LogSegment]:
        """The log's segments in order, contiguous; one empty at `log_start_offset` if none."""
        segment_swap.complete_swaps(self.dir)
        for stale in list(self.dir.glob("*.tmp")) + list(self.dir.glob("*.deleted")):
            stale.unlink()
        segments: list[LogSegment] = []
        bases = sorted(int(p.name[:20]) for p in self.dir.glob("*.log") if p.name[:20].isdigit())
        for base in bases:
            mtime_ms = int((self.dir / f"{base:020d}.log").stat().st_mtime * 1000)
            segment = self.new_segment(base, mtime_ms)
            missing_index = segment.size > 0 and not segment.offset_index.entries
            if missing_index or (
                not self.had_clean_shutdown
                and base >= _segment_base_for(self.recovery_point, bases)
            ):
                truncated = segment.recover(self.leader_epoch_cache)
                if truncated:
                    log.warning(
                        "%s: truncated %d invalid bytes at the end of %s",
                        self.topic_partition,
                        truncated,
                        segment.log_path,
                    )
            else:
                segment.load_state()
            if segments and segment.base_offset < segments[-1].next_offset:
                raise ValueError(f"{segment.log_path}: overlaps the segment before it")
            segments.append(segment)
        # A truncated segment can leave later ones orphaned: drop everything after a gap.
        for i in range(1, len(segments)):
            if (
                segments[i].base_offset != segments[i - 1].next_offset
                and not segments[i - 1].is_empty
            ):
                for orphan in segments[i:]:
                    log.warning(
                        "%s: removing %s after a gap in the log",
                        self.topic_partition,
                        orphan.log_path,
                    )
                    orphan.close()
                    orphan.unlink()
                del segments[i:]
                break
        if not segments:
            segments.append(self.new_segment(log_start_offset, None))
        return segments


def _segment_base_for(offset: int, bases: list[int]) -> int:
    i = bisect.bisect_right(bases, offset) - 1
    return bases[i] if i >= 0 else 0
