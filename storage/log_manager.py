"""`LogManager`: every partition log of a broker's log dirs, and their checkpoints.

Each log dir holds one directory per partition and three checkpoint files, each
written atomically: `recovery-point-offset-checkpoint`,
`log-start-offset-checkpoint` and `replication-offset-checkpoint` (high
watermarks). A clean shutdown leaves `.kafka_cleanshutdown`, written only for a
log dir that was loaded whole, then flushed and checkpointed whole; without it,
logs are recovered from their recovery points on the next start. An I/O error in
a log dir takes it offline (`LogDirFailureChannel`): its logs are not written,
flushed or checkpointed again by this process, and no log is created there. A log
dir short of free space refuses produce until space is freed (`FreeSpaceGuard`). Not
shared between tasks: the broker calls it from the event loop (loading runs in one
thread before that); only the files of new logs are written in worker threads
(`create_logs`), and the loop registers the logs they return. A deleted log's
directory is renamed to Kafka's `<topic>-<partition>.<id>-delete` on the loop and
removed in a worker thread (unlinking a large log's files takes long); one a stop or
crash left behind is removed at the next start.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.checkpoints import OffsetCheckpointFile, read_partition_metadata
from tierbroker.storage.file_cache import LogFileCache
from tierbroker.storage.free_space import FreeSpaceGuard
from tierbroker.storage.local_log import delete_segment_files
from tierbroker.storage.log import Log, flush_segments, now_ms
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_dir_failure import LogDirFailureChannel, describe
from tierbroker.storage.segment import LogSegment
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"
# Creating a log is mostly fsyncs (its metadata and epoch checkpoint): threads let the
# file system commit them together. More threads than this contend with the event loop
# for the GIL: with 16, one CreateTopics of 10,000 partitions kept ApiVersions' p99 at
# about 120 ms on two cores, against about 30 ms with 4, in the same time.
LOG_CREATION_THREADS = 4
DELETED_DIR_SUFFIX = "-delete"


class LogManager:
    def __init__(self, log_dirs: list[Path], *, min_free_bytes: int | None = 0) -> None:
        """`min_free_bytes`: `log.dir.min.free.bytes` (None: its default; 0: no floor)."""
        self.log_dirs = log_dirs
        self.logs: dict[TopicPartition, Log] = {}
        self.failure_channel = LogDirFailureChannel()
        self.free_space = FreeSpaceGuard(min_free_bytes)
        self.file_cache = LogFileCache.sized_from_rlimit()  # its logs' open `.log` files
        self._loaded_dirs: set[Path] = set()  # log dirs whose every partition was loaded
        self._logs_per_dir: Counter[Path] = Counter()
        self._creation_pool: ThreadPoolExecutor | None = None
        self._deleting: set[asyncio.Future[None]] = set()  # deleted logs and segments being removed
        for d in log_dirs:
            d.mkdir(parents=True, exist_ok=True)

    @property
    def online_log_dirs(self) -> list[Path]:
        return [d for d in self.log_dirs if not self.failure_channel.is_offline(d)]

    def is_online(self, lg: Log) -> bool:
        """On every produce and fetch: no path arithmetic while every dir is online."""
        return not self.failure_channel.offline or not self.failure_channel.is_offline(
            lg.dir.parent
        )

    @contextmanager
    def io_guard(self, log_dir: Path, action: str, *, loading: bool = False) -> Iterator[None]:
        """Take `log_dir` offline on an OSError in the block (out of file descriptors: only
        while `loading`), and carry on (the error is logged)."""
        try:
            yield
        except OSError as e:
            self.failure_channel.maybe_add_offline_log_dir(log_dir, e, action, loading=loading)

    def storage_error(
        self, log_dir: Path, tp: TopicPartition, error: OSError, action: str
    ) -> KafkaError:
        """Take `log_dir` offline after `error` while `action` on `tp`; the
        KAFKA_STORAGE_ERROR the client gets. Out of file descriptors, the dir stays online
        and the client, told the same, retries."""
        if self.failure_channel.maybe_add_offline_log_dir(log_dir, error, action):
            return KafkaError(
                ErrorCode.kafka_storage_error,
                f"{tp}: log dir {log_dir} is offline: {describe(error)}",
            )
        # Retriable in stock clients (Java's KafkaStorageException, librdkafka), and it
        # says what happened: nothing was written, for want of a file.
        return KafkaError(
            ErrorCode.kafka_storage_error,
            f"{tp}: {action} failed with {describe(error)}; nothing was written, retry",
        )

    def load_logs(
        self, config_for: Callable[[TopicPartition, uuid.UUID], LogConfig | None]
    ) -> None:
        """Open (and if needed recover) every partition directory of known topics.

        Directories `config_for` does not know (their topic, or that topic id, was deleted
        while the broker was down) are removed.
        """
        for log_dir in self.log_dirs:
            with self.io_guard(log_dir, "loading its logs", loading=True):
                self._load_dir(log_dir, config_for)
                self._loaded_dirs.add(log_dir)

    def _load_dir(
        self, log_dir: Path, config_for: Callable[[TopicPartition, uuid.UUID], LogConfig | None]
    ) -> None:
        clean_marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean = clean_marker.exists()
        recovery = OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).read()
        starts = OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).read()
        watermarks = OffsetCheckpointFile(log_dir / HIGH_WATERMARK_CHECKPOINT).read()
        for path in sorted(p for p in log_dir.iterdir() if p.is_dir()):
            if path.name.endswith(DELETED_DIR_SUFFIX):
                log.info("removing %s: a log deleted before the broker stopped", path)
                shutil.rmtree(path)
                continue
            try:
                tp = TopicPartition.from_dir_name(path.name)
            except ValueError:
                continue
            topic_id = read_partition_metadata(path / "partition.metadata")
            config = config_for(tp, topic_id) if topic_id is not None else None
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
                    file_cache=self.file_cache,
                )
            )
        clean_marker.unlink(missing_ok=True)

    def _register(self, log_: Log) -> None:
        self.logs[log_.topic_partition] = log_
        self._logs_per_dir[log_.dir.parent] += 1

    def _log_dir_for_new(self, tp: TopicPartition, planned: Counter[Path] | None = None) -> Path:
        """The online log dir holding the fewest logs (counting `planned` ones too).

        A partition of an offline dir must not come back empty in another one.
        """
        online = self.online_log_dirs
        offline = [d for d in self.failure_channel.offline if (d / str(tp)).exists()]
        if offline or not online:
            where = f"its log dir {offline[0]} is" if offline else "no log dir is"
            raise KafkaError(ErrorCode.kafka_storage_error, f"{tp}: {where} offline")
        counts = self._logs_per_dir if planned is None else planned
        return min(online, key=lambda d: counts[d])

    async def create_logs(
        self,
        tps: list[TopicPartition],
        topic_id: uuid.UUID,
        config: LogConfig,
        leader_epoch: int | None = None,
    ) -> None:
        """Create the logs of new partitions, their files written in worker threads; with
        `leader_epoch`, each log's epoch checkpoint already holds it from offset 0.

        A directory left on disk (a log never registered) is opened on the loop instead,
        as loading may read its segments through the loop's file cache.
        """
        loop = asyncio.get_running_loop()
        if self._creation_pool is None:
            self._creation_pool = ThreadPoolExecutor(LOG_CREATION_THREADS, "log-creation")
        pool = self._creation_pool

        def create(directory: Path, tp: TopicPartition) -> Log:
            created = Log(directory, tp, config, topic_id, file_cache=self.file_cache)
            if leader_epoch is not None:
                created.leader_epoch_cache.assign(leader_epoch, 0)
            return created

        planned = Counter(self._logs_per_dir)  # dirs of this batch, so they stay balanced
        pending: list[tuple[Path, TopicPartition, asyncio.Future[Log]]] = []
        for tp in tps:
            if tp in self.logs:
                continue
            log_dir = self._log_dir_for_new(tp, planned)
            planned[log_dir] += 1
            if (log_dir / str(tp)).exists():
                try:
                    self._register(create(log_dir / str(tp), tp))
                except OSError as e:
                    raise self.storage_error(log_dir, tp, e, f"creating {tp}") from e
            else:
                job = loop.run_in_executor(pool, create, log_dir / str(tp), tp)
                pending.append((log_dir, tp, job))
        outcomes = await asyncio.gather(*(job for *_, job in pending), return_exceptions=True)
        failure: KafkaError | None = None
        for (log_dir, tp, _), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, Log):
                self._register(outcome)
            elif isinstance(outcome, OSError):
                failure = failure or self.storage_error(log_dir, tp, outcome, f"creating {tp}")
            else:
                raise outcome
        if failure is not None:
            raise failure

    def delete_log(self, tp: TopicPartition) -> None:
        """Forget `tp`'s log and delete its files: at once from the partition's path (a
        rename), in a worker thread from the disk when called on an event loop."""
        removed = self.logs.pop(tp, None)
        if removed is None:
            return
        self._logs_per_dir[removed.dir.parent] -= 1
        doomed = removed.dir.with_name(f"{removed.dir.name}.{uuid.uuid4().hex}{DELETED_DIR_SUFFIX}")
        # Files left by an I/O error are removed at the next start (topic unknown).
        with self.io_guard(removed.dir.parent, f"deleting {tp}"):
            removed.close()
            removed.dir.rename(doomed)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                shutil.rmtree(doomed)
                return
            removing = loop.run_in_executor(None, _remove_deleted, doomed)
            self._deleting.add(removing)
            removing.add_done_callback(self._deleting.discard)

    async def wait_deletions(self, timeout_s: float) -> None:
        """Wait for deleted logs' files to be removed (a stopping broker leaves no worker
        removing them); what is not removed in time is removed at the next start."""
        if self._deleting:
            await asyncio.wait(list(self._deleting), timeout=timeout_s)

    # Periodic work -------------------------------------------------------------------

    def cleanup_logs(self) -> int:
        """Apply local retention to every online log; returns the number of segments removed."""
        removed = 0
        for lg in self._online_logs():
            with self.io_guard(lg.dir.parent, f"retention of {lg.topic_partition}"):
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
            self._delete_files(lg.take_deleted(now_ms() - lg.config.file_delete_delay_ms))
        return removed

    def _delete_files(self, segments: list[LogSegment]) -> None:
        """Unlink removed segments' files in the default executor (tracked like deleted
        logs, so `wait_deletions` waits for them); at once without a running loop."""
        if not segments:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            delete_segment_files(segments)
            return
        removing = loop.run_in_executor(None, delete_segment_files, segments)
        self._deleting.add(removing)
        removing.add_done_callback(self._deleting.discard)

    def remove_expired_producers(self, older_than_ms: int) -> None:
        """Forget idempotent producers idle since `older_than_ms` (producer.id.expiration.ms)."""
        for lg in list(self.logs.values()):
            lg.producer_state.remove_expired(older_than_ms)

    async def flush_rolled_segments(self) -> None:
        """fsync rolled segments in the default executor, then advance recovery points.

        Only the fsync leaves the event loop; log state is read and set on the loop.
        """
        loop = asyncio.get_running_loop()
        for lg in self._online_logs():
            target = lg.active_segment.base_offset
            segments = lg.segments_to_flush(target)
            if not segments:
                continue
            with self.io_guard(lg.dir.parent, f"flushing {lg.topic_partition}"):
                await loop.run_in_executor(
                    None, flush_segments, segments, lg.producer_state, lg.leader_epoch_cache
                )
                lg.recovery_point = max(lg.recovery_point, target)

    def checkpoint(self) -> None:
        """Write recovery points, log start offsets and high watermarks of every log dir."""
        self.write_checkpoints(self.checkpoint_offsets())

    def checkpoint_offsets(self) -> dict[Path, dict[str, dict[TopicPartition, int]]]:
        """Per writable log dir, each checkpoint file's offsets as they are now: a copy to
        write off the event loop (`write_checkpoints` in an executor), since the writes fsync."""
        return {log_dir: self._dir_offsets(log_dir) for log_dir in self._writable_log_dirs()}

    def _dir_offsets(self, log_dir: Path) -> dict[str, dict[TopicPartition, int]]:
        logs = {tp: lg for tp, lg in self.logs.items() if lg.dir.parent == log_dir}
        return {
            RECOVERY_POINT_CHECKPOINT: {tp: lg.recovery_point for tp, lg in logs.items()},
            LOG_START_OFFSET_CHECKPOINT: {tp: lg.log_start_offset for tp, lg in logs.items()},
            HIGH_WATERMARK_CHECKPOINT: {tp: lg.high_watermark for tp, lg in logs.items()},
        }

    def write_checkpoints(self, offsets: dict[Path, dict[str, dict[TopicPartition, int]]]) -> None:
        """Write each dir's checkpoint files atomically; an OSError takes that dir offline.

        Safe in a worker thread: it reads no log, and the failure channel's listeners are.
        """
        for log_dir, files in offsets.items():
            with self.io_guard(log_dir, "writing checkpoints"):
                _write_dir_checkpoints(log_dir, files)

    def _online_logs(self) -> list[Log]:
        return [lg for lg in self.logs.values() if self.is_online(lg)]

    def _writable_log_dirs(self) -> list[Path]:
        """Online log dirs whose every partition was loaded: only their checkpoints are whole."""
        return [d for d in self.online_log_dirs if d in self._loaded_dirs]

    def shutdown(self) -> None:
        """Flush, checkpoint and mark cleanly shut down each log dir that can be; close all.

        The marker says the next start may skip recovery, so it is written only for a
        dir loaded whole (not after a start that failed while loading it) and only
        after its flush and checkpoints succeeded; an offline dir is not touched.
        """
        for log_dir in self._writable_log_dirs():
            with self.io_guard(log_dir, "shutting down"):
                for lg in self.logs.values():
                    if lg.dir.parent == log_dir:
                        lg.flush()
                        lg.take_producer_snapshot()
                _write_dir_checkpoints(log_dir, self._dir_offsets(log_dir))
                (log_dir / CLEAN_SHUTDOWN_FILE).touch()
        for lg in self.logs.values():
            lg.close()


def _remove_deleted(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError as e:
        log.warning("could not remove %s (removed at the next start): %s", path, describe(e))


def _write_dir_checkpoints(log_dir: Path, files: dict[str, dict[TopicPartition, int]]) -> None:
    for name, entries in files.items():
        OffsetCheckpointFile(log_dir / name).write(entries)
