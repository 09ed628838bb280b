"""`RemoteLogManagerConfig`: the broker's `remote.log.*` settings, Kafka's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass

UNLIMITED = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteLogManagerConfig:
    task_interval_ms: int = 30_000  # remote.log.manager.task.interval.ms
    task_retry_backoff_ms: int = 500  # remote.log.manager.task.retry.backoff.ms
    task_retry_backoff_max_ms: int = 30_000  # remote.log.manager.task.retry.backoff.max.ms
    copier_pool_size: int = 10  # remote.log.manager.copier.thread.pool.size
    expiration_pool_size: int = 10  # remote.log.manager.expiration.thread.pool.size
    follower_pool_size: int = 2  # remote.log.manager.follower.thread.pool.size
    reader_threads: int = 10  # remote.log.reader.threads
    reader_max_pending_tasks: int = 100  # remote.log.reader.max.pending.tasks
    index_cache_bytes: int = 1 << 30  # remote.log.index.file.cache.total.size.bytes
    fetch_max_wait_ms: int = 500  # remote.fetch.max.wait.ms
    copy_max_bytes_per_second: int = UNLIMITED  # remote.log.manager.copy.max.bytes.per.second
    fetch_max_bytes_per_second: int = UNLIMITED  # remote.log.manager.fetch.max.bytes.per.second
    custom_metadata_max_bytes: int = 128  # remote.log.metadata.custom.metadata.max.bytes
    # remote.log.manager.call.timeout.ms (tierbroker's): every RSM and RLMM call's bound
    remote_call_timeout_ms: int = 60_000
    # remote.log.manager.stuck.copy.timeout.ms: COPY_SEGMENT_STARTED older than this is abandoned
    stuck_copy_timeout_ms: int = 300_000
