"""`LogManager`: every partition log of a broker's log dirs, and their checkpoints.

Each log dir holds one directory per partition and three checkpoint files, each
written atomically: `recovery-point-offset-checkpoint`,
`log-start-offset-checkpoint` and `replication-offset-checkpoint` (high
watermarks). A clean shutdown leaves `.kafka_cleanshutdown`; without it, logs are
recovered from their recovery points on the next start. Not shared between tasks:
the broker calls it from the event loop; only the files of new logs are written in
worker threads (`create_logs`), and the loop registers the logs they return.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from storage.checkpoints import OffsetCheckpointFile, read_partition_metadata
from storage.log import Log, flush_segments, now_ms
from storage.log_config import LogConfig
from storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"
# Creating a log is mostly fsyncs (its metadata and epoch checkpoint): threads let the
# file system commit them together.
LOG_CREATION_THREADS = 16


class LogManager:
    def __init__(self, log_dirs: list[Path]) -> None:
        self.log_dirs = log_dirs
        self.logs: dict[TopicPartition, Log] = {}
        self._logs_per_dir: Counter[Path] = Counter()
        self._creation_pool: ThreadPoolExecutor | None = None
        for d in log_dirs:
            d.mkdir(parents=True, exist_ok=True)

    def load_logs(self, config_for: Callable[[TopicPartition], LogConfig | None]) -> None:
        """Open (and if needed recover) every partition directory of known topics.

        Directories of topics `config_for` does not know (deleted while down) are removed.
        """
        for log_dir in self.log_dirs:
            clean_marker = log_dir / CLEAN_SHUTDOWN_FILE
            clean = clean_marker.exists()
            recovery = OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).read()
            starts = OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).read()
            watermarks = OffsetCheckpointFile(log_dir / HIGH_WATERMARK_CHECKPOINT).read()
            for path in sorted(p for p in log_dir.iterdir() if p.is_dir()):
                try:
                    tp = TopicPartition.from_dir_name(path.name)
                except ValueError:
                    continue
                config = config_for(tp)
                topic_id = read_partition_metadata(path / "partition.metadata")
                if config is None or topic_id is None:
                    log.info("removing %s: its topic no longer exists", path)
                    shutil.rmtree(path)
                    continue
                self._register(
                    Log(
                        path,
                        tp,
                        config,
                        topic_id,
                        recovery_point=recovery.get(tp, 0),
                        log_start_offset=starts.get(tp, 0),
                        high_watermark=watermarks.get(tp, 0),
                        had_clean_shutdown=clean,
                    )
                )
            clean_marker.unlink(missing_ok=True)

    def _register(self, log_: Log) -> None:
        self.logs[log_.topic_partition] = log_
        self._logs_per_dir[log_.dir.parent] += 1

    def _next_log_dir(self) -> Path:
        """The log dir holding the fewest logs."""
        return min(self.log_dirs, key=lambda d: self._logs_per_dir[d])

    def get_or_create_log(self, tp: TopicPartition, topic_id: uuid.UUID, config: LogConfig) -> Log:
        existing = self.logs.get(tp)
        if existing is not None:
            return existing
        created = Log(self._next_log_dir() / str(tp), tp, config, topic_id)
        self._register(created)
        return created

    async def create_logs(
        self,
        tps: list[TopicPartition],
        topic_id: uuid.UUID,
        config: LogConfig,
        leader_epoch: int,
    ) -> None:
        """Create the logs of new partitions, their files written in worker threads, each
        log's epoch checkpoint already at `leader_epoch` from offset 0.

        A directory left on disk (a log never registered) is opened on the loop instead,
        as loading may read its segments through the loop's file cache.
        """
        loop = asyncio.get_running_loop()
        if self._creation_pool is None:
            self._creation_pool = ThreadPoolExecutor(LOG_CREATION_THREADS, "log-creation")
        pool = self._creation_pool

        def create(directory: Path, tp: TopicPartition) -> Log:
            created = Log(directory, tp, config, topic_id)
            created.leader_epoch_cache.assign(leader_epoch, 0)
            return created

        planned = Counter(self._logs_per_dir)  # dirs of this batch, so they stay balanced
        pending = []
        for tp in tps:
            if tp in self.logs:
                continue
            log_dir = min(self.log_dirs, key=lambda d: planned[d])
            planned[log_dir] += 1
            if (log_dir / str(tp)).exists():
                self._register(create(log_dir / str(tp), tp))
            else:
                pending.append(loop.run_in_executor(pool, create, log_dir / str(tp), tp))
        for created in await asyncio.gather(*pending):
            self._register(created)

    def delete_log(self, tp: TopicPartition) -> None:
        removed = self.logs.pop(tp, None)
        if removed is not None:
            self._logs_per_dir[removed.dir.parent] -= 1
            removed.delete()

    # Periodic work -------------------------------------------------------------------

    def cleanup_logs(self) -> int:
        """Apply local retention to every log; returns the number of segments removed."""
        removed = 0
        for lg in list(self.logs.values()):
            deleted = lg.delete_old_segments()
            if deleted:
                log.info(
                    "%s: retention removed %d segments; log start %d, local log start %d",
                    lg.topic_partition,
                    len(deleted),
                    lg.log_start_offset,
                    lg.local_log_start_offset,
                )
            removed += len(deleted)
            lg.close_deleted(now_ms() - lg.config.file_delete_delay_ms)
        return removed

    def remove_expired_producers(self, older_than_ms: int) -> None:
        """Forget idempotent producers idle since `older_than_ms` (producer.id.expiration.ms)."""
        for lg in list(self.logs.values()):
            lg.producer_state.remove_expired(older_than_ms)

    async def flush_rolled_segments(self) -> None:
        """fsync rolled segments in the default executor, then advance recovery points.

        Only the fsync leaves the event loop; log state is read and set on the loop.
        """
        loop = asyncio.get_running_loop()
        for lg in list(self.logs.values()):
            target = lg.active_segment.base_offset
            segments = lg.segments_to_flush(target)
            if not segments:
                continue
            await loop.run_in_executor(None, flush_segments, segments, lg.producer_state)
            lg.recovery_point = max(lg.recovery_point, target)

    def checkpoint(self) -> None:
        """Write recovery points, log start offsets and high watermarks of every log dir."""
        for log_dir in self.log_dirs:
            logs = {tp: lg for tp, lg in self.logs.items() if lg.dir.parent == log_dir}
            OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).write(
                {tp: lg.recovery_point for tp, lg in logs.items()}
            )
            OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).write(
                {tp: lg.log_start_offset for tp, lg in logs.items()}
            )
            OffsetCheckpointFile(log_dir / HIGH_WATERMARK_CHECKPOINT).write(
                {tp: lg.high_watermark for tp, lg in logs.items()}
            )

    def shutdown(self) -> None:
        """Flush everything, checkpoint, close, and mark each log dir cleanly shut down."""
        for lg in self.logs.values():
            lg.flush()
            lg.take_producer_snapshot()
        self.checkpoint()
        for lg in self.logs.values():
            lg.close()
        for log_dir in self.log_dirs:
            (log_dir / CLEAN_SHUTDOWN_FILE).touch()
