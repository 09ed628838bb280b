"""`LogCleaner`: compaction of the logs whose `cleanup.policy` holds `compact`, beside
serving (Kafka's `LogCleaner`).

`log.cleaner.threads` cleaner tasks each loop: take the filthiest log
(`LogCleanerManager`), run one pass over it (`cleaner.clean`) in a process pool of as
many workers, swap the new segments in on the event loop (`Log.replace_segments`,
cheap renames), write the cleaner checkpoint in a thread, and log what the pass
did. With nothing to clean, a task waits `log.cleaner.backoff.ms`. The pass runs in
another process because it parses every record: in a thread it would hold the
interpreter lock the event loop needs.

A pass that fails on its log (a corrupt batch, a worker that died) makes the log
uncleanable until the broker restarts, with a log line and
`uncleanable_partitions_count`; the others go on. One that fails on the file system
(ENOSPC) leaves nothing behind and comes again after the backoff; a task that fails
otherwise logs it and goes on after the backoff.
`stop` tells running passes to stop, cancels the tasks, and waits for the workers;
a pass's unswapped files are removed by the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.synchronize
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from tierbroker.storage import segment_swap
from tierbroker.storage.checkpoints import OffsetCheckpointFile
from tierbroker.storage.cleaner import (
    CleanerStats,
    CleaningError,
    CleaningResult,
    CleaningTask,
    SegmentToClean,
    clean,
    init_worker,
)
from tierbroker.storage.log import Log, now_ms
from tierbroker.storage.log_cleaner_manager import (
    CLEANER_CHECKPOINT,
    LogCleanerManager,
    LogToClean,
)
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.segment import LogSegment

log = logging.getLogger(__name__)

_MB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanerConfig:
    """The broker's `log.cleaner.*` configs, with Kafka's defaults."""

    enable: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 128 * _MB
    io_buffer_load_factor: float = 0.9
    io_max_bytes_per_second: float = float("inf")
    backoff_ms: int = 15_000


class LogCleaner:
    def __init__(self, log_manager: LogManager, config: CleanerConfig) -> None:
        self.log_manager = log_manager
        self.config = config
        self.manager = LogCleanerManager(log_manager.log_dirs)
        self.last_stats: list[CleanerStats | None] = [None] * config.threads
        self.last_run_ms = now_ms()
        self._tasks: list[asyncio.Task[None]] = []
        self._pool: ProcessPoolExecutor | None = None
        self._context = multiprocessing.get_context("spawn")
        self._stop: multiprocessing.synchronize.Event | None = None

    def start(self) -> None:
        if not self.config.enable:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(i), name=f"log-cleaner-{i}")
            for i in range(self.config.threads)
        ]

    @property
    def dead_threads(self) -> int:
        return sum(1 for task in self._tasks if task.done())

    async def stop(self, timeout_s: float) -> None:
        if self._stop is not None:
            self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            shutdown = asyncio.get_running_loop().run_in_executor(None, pool.shutdown, True)
            try:
                await asyncio.wait_for(shutdown, timeout_s)
            except TimeoutError:
                log.warning("log cleaner workers did not stop within %.1fs", timeout_s)

    async def _run(self, thread: int) -> None:
        """One cleaner thread: clean while there is work, else wait the backoff."""
        backoff_s = self.config.backoff_ms / 1000
        while True:
            try:
                cleaned = await self._clean_filthiest(thread)
            except Exception:
                log.exception("log cleaner %d failed; it goes on in %.1fs", thread, backoff_s)
                cleaned = False
            if not cleaned:
                await asyncio.sleep(backoff_s)

    def _worker_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._stop = self._context.Event()
            self._pool = ProcessPoolExecutor(
                self.config.threads,
                mp_context=self._context,
                initializer=init_worker,
                initargs=(self._stop, os.getpid()),
            )
        return self._pool

    async def _clean_filthiest(self, thread: int) -> bool:
        """One pass over the filthiest log, if one needs it; whether one did."""
        self.last_run_ms = now = now_ms()
        chosen = self.manager.grab_filthiest(self._online_logs(), now)
        if chosen is None:
            return False
        lg = chosen.log
        planned = [s for s in lg.segments[:-1] if s.base_offset < chosen.first_uncleanable_offset]
        sizes = {s.base_offset: s.size for s in planned}
        task = self._task(chosen, planned, now)
        loop = asyncio.get_running_loop()
        end_offset: int | None = None
        try:
            result = await loop.run_in_executor(self._worker_pool(), clean, task)
            if self._swap_in(lg, result, {s.base_offset: s for s in planned}, sizes):
                end_offset = result.end_offset
                self.last_stats[thread] = result.stats
                self._log_pass(lg, result, sizes)
        except CleaningError as e:
            self._uncleanable(lg, str(e))
        except BrokenProcessPool:
            self._pool = None  # made again for the next pass
            self._uncleanable(lg, "its cleaner worker died")
        except OSError as e:  # out of space, say: the files go, the pass comes again
            log.warning("%s: cleaning failed, to be tried again: %s", lg.topic_partition, e)
            self._discard(lg, planned)
            return False
        finally:  # whatever happened, the log is no longer in progress
            entries = self.manager.done_cleaning(lg, end_offset)
        if entries is not None:
            self.manager.forget(self.log_manager.logs)
            path = lg.dir.parent / CLEANER_CHECKPOINT
            with self.log_manager.io_guard(lg.dir.parent, "writing the cleaner checkpoint"):
                await loop.run_in_executor(None, OffsetCheckpointFile(path).write, entries)
        return True

    def _task(self, chosen: LogToClean, planned: list[LogSegment], now: int) -> CleaningTask:
        lg, config = chosen.log, chosen.log.config
        producers = lg.producer_state.producers.values()
        return CleaningTask(
            topic_partition=lg.topic_partition,
            directory=str(lg.dir),
            segments=tuple(_planned(s) for s in planned),
            first_dirty_offset=chosen.first_dirty_offset,
            first_uncleanable_offset=chosen.first_uncleanable_offset,
            producer_last_offsets={
                p.producer_id: p.batches[-1].last_offset for p in producers if p.batches
            },
            aborted_txns=tuple(
                lg.collect_aborted_txns(planned[0].base_offset, chosen.first_uncleanable_offset)
            ),
            now_ms=now,
            delete_retention_ms=config.delete_retention_ms,
            segment_bytes=config.segment_bytes,
            max_index_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
            map_memory_bytes=self.config.dedupe_buffer_size // self.config.threads,
            map_load_factor=self.config.io_buffer_load_factor,
            io_max_bytes_per_second=self.config.io_max_bytes_per_second / self.config.threads,
        )

    def _swap_in(
        self,
        lg: Log,
        result: CleaningResult,
        planned: dict[int, LogSegment],
        sizes: dict[int, int],
    ) -> bool:
        """Swap each new segment in; False (and the rest discarded) once the log changed."""
        manager = self.log_manager
        live = manager.logs.get(lg.topic_partition) is lg and manager.is_online(lg)
        for group in result.groups:
            replaced = [planned[base] for base in group.replaced]
            swapped = False
            if live:
                with self.log_manager.io_guard(lg.dir.parent, f"cleaning {lg.topic_partition}"):
                    swapped = (
                        lg.replace_segments(
                            group.base_offset, replaced, [sizes[b] for b in group.replaced]
                        )
                        is not None
                    )
            if not swapped:
                live = False
                with contextlib.suppress(OSError):
                    segment_swap.discard(lg.dir, group.base_offset)
        return live

    def _discard(self, lg: Log, planned: list[LogSegment]) -> None:
        """Remove what a failed pass may have written."""
        for segment in planned:
            with contextlib.suppress(OSError):
                segment_swap.discard(lg.dir, segment.base_offset)

    def _uncleanable(self, lg: Log, why: str) -> None:
        self.manager.mark_uncleanable(lg)
        log.error("%s is uncleanable until the broker restarts: %s", lg.topic_partition, why)

    def _log_pass(self, lg: Log, result: CleaningResult, sizes: dict[int, int]) -> None:
        stats = result.stats
        before = sum(sizes[base] for group in result.groups for base in group.replaced)
        after = sum(group.size for group in result.groups)
        log.info(
            "%s: cleaned up to offset %d: %d bytes -> %d (%.1f%% smaller) in %.2fs "
            "(%.1f MB/s); %d of %d records kept; offset map %.0f%% full",
            lg.topic_partition,
            result.end_offset,
            before,
            after,
            100 * (1 - after / before) if before else 0.0,
            stats.elapsed_s,
            (stats.bytes_read + stats.dirty_bytes) / _MB / max(stats.elapsed_s, 1e-9),
            stats.records_retained,
            stats.records_read,
            100 * stats.map_utilization,
        )

    def status(self) -> list[dict[str, object]]:
        """Each compacted log hosted here: how dirty it is now, for operators."""
        now = now_ms()
        rows: list[dict[str, object]] = []
        for lg in self._online_logs():
            cleanable = self.manager.cleanable(lg, now)
            rows.append(
                {
                    "topic": lg.topic_partition.topic,
                    "partition": lg.topic_partition.partition,
                    "dirty_ratio": round(cleanable.cleanable_ratio, 4),
                    "first_dirty_offset": cleanable.first_dirty_offset,
                    "cleanable_bytes": cleanable.cleanable_bytes,
                    "size_bytes": lg.size_in_bytes,
                    "uncleanable": lg.topic_partition
                    in self.manager.uncleanable.get(lg.dir.parent, ()),
                }
            )
        return rows

    def _online_logs(self) -> list[Log]:
        """The compacted logs of online log dirs."""
        manager = self.log_manager
        return [lg for lg in manager.logs.values() if lg.config.compact and manager.is_online(lg)]


def _planned(segment: LogSegment) -> SegmentToClean:
    return SegmentToClean(
        base_offset=segment.base_offset,
        path=str(segment.log_path),
        size=segment.size,
        next_offset=segment.next_offset,
        offset_index_entries=segment.offset_index.entries,
        time_index_entries=segment.time_index.entries,
        mtime_ns=segment.log_path.stat().st_mtime_ns,
    )
