"""`LogManager`: every partition log of a broker's log dirs, and their checkpoints.

Each log dir holds one directory per partition and three checkpoint files, each
written atomically: `recovery-point-offset-checkpoint`,
`log-start-offset-checkpoint` and `replication-offset-checkpoint` (high
watermarks). A clean shutdown leaves `.kafka_cleanshutdown`; without it, logs are
recovered from their recovery points on the next start. Not shared between tasks:
the broker calls it from the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import Callable
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


class LogManager:
    def __init__(self, log_dirs: list[Path]) -> None:
        self.log_dirs = log_dirs
        self.logs: dict[TopicPartition, Log] = {}
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
                self.logs[tp] = Log(
                    path,
                    tp,
                    config,
                    topic_id,
                    recovery_point=recovery.get(tp, 0),
                    log_start_offset=starts.get(tp, 0),
                    high_watermark=watermarks.get(tp, 0),
                    had_clean_shutdown=clean,
                )
            clean_marker.unlink(missing_ok=True)

    def get_or_create_log(self, tp: TopicPartition, topic_id: uuid.UUID, config: LogConfig) -> Log:
        existing = self.logs.get(tp)
        if existing is not None:
            return existing
        log_dir = min(
            self.log_dirs, key=lambda d: sum(1 for lg in self.logs.values() if lg.dir.parent == d)
        )
        created = Log(log_dir / str(tp), tp, config, topic_id)
        self.logs[tp] = created
        return created

    def delete_log(self, tp: TopicPartition) -> None:
        removed = self.logs.pop(tp, None)
        if removed is not None:
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
        write_checkpoints(self.checkpoint_offsets())

    def checkpoint_offsets(self) -> dict[Path, dict[TopicPartition, int]]:
        """Each checkpoint file's offsets as they are now: a copy to write off the event loop
        (`write_checkpoints` in an executor), since the writes fsync."""
        files: dict[Path, dict[TopicPartition, int]] = {}
        for log_dir in self.log_dirs:
            logs = {tp: lg for tp, lg in self.logs.items() if lg.dir.parent == log_dir}
            files[log_dir / RECOVERY_POINT_CHECKPOINT] = {
                tp: lg.recovery_point for tp, lg in logs.items()
            }
            files[log_dir / LOG_START_OFFSET_CHECKPOINT] = {
                tp: lg.log_start_offset for tp, lg in logs.items()
            }
            files[log_dir / HIGH_WATERMARK_CHECKPOINT] = {
                tp: lg.high_watermark for tp, lg in logs.items()
            }
        return files

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


def write_checkpoints(files: dict[Path, dict[TopicPartition, int]]) -> None:
    """Write each checkpoint file atomically; safe in any thread (touches no log)."""
    for path, offsets in files.items():
        OffsetCheckpointFile(path).write(offsets)
