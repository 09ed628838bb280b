"""`BrokerServer`: builds a broker from its config, starts it, and stops it in order.

Built from a checked config and the ports the preflight bound (`BoundPorts`), so it
knows the address it advertises before it starts. Start: load and recover logs,
lead the known partitions, start the remote tier (load its metadata, hand it the
led partitions), load consumer groups from `__consumer_offsets`, start background
jobs and the metrics endpoint, then listen, and log a summary (`startup_summary`).
Stop: stop coordinating groups (answering waiting joins and syncs), stop
listening and finish requests in hand (with a timeout), stop background jobs and
the metrics endpoint, stop the remote tier (its pools, then a metadata snapshot),
then flush and checkpoint every log and mark a clean shutdown.

A log dir that fails (an I/O error) goes offline and its partitions answer
KAFKA_STORAGE_ERROR; when no log dir is left online the broker asks to be stopped
(`stop_requested`, with `fatal_error` saying which dir failed and why), as Kafka
halts, and stops in the same order, leaving the offline dirs untouched.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tierbroker.broker.cluster.controller import Controller
from tierbroker.broker.cluster.metadata_store import LocalMetadataStore
from tierbroker.broker.config import BrokerConfig
from tierbroker.broker.endpoints import BrokerEndpoints, broker_endpoints
from tierbroker.broker.groups.coordinator import GroupConfig, GroupCoordinator
from tierbroker.broker.groups.offsets_store import GroupMetadataManager, OffsetsConfig
from tierbroker.broker.handlers import RequestDispatcher
from tierbroker.broker.handlers.common import BrokerContext
from tierbroker.broker.metrics import MetricsServer
from tierbroker.broker.preflight import BoundPorts
from tierbroker.broker.remote_storage import build_remote_log_manager
from tierbroker.broker.replica_manager import ReplicaManager
from tierbroker.broker.scheduler import Scheduler
from tierbroker.broker.server import SocketServer
from tierbroker.broker.startup_summary import startup_summary
from tierbroker.broker.topic_metrics import BrokerTopicMetrics
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.log import now_ms
from tierbroker.storage.log_dir_failure import describe
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class LogDirsOffline(Exception):
    """No log dir is online: the broker cannot serve a partition and must stop."""


class BrokerServer:
    def __init__(self, config: BrokerConfig, ports: BoundPorts) -> None:
        """`ports`: bound by `preflight` (or `bind_ports`); the broker closes them."""
        self.config = config
        self.ports = ports
        self.endpoints: BrokerEndpoints = broker_endpoints(config, ports.port, ports.metrics_port)
        self.log_manager = LogManager(config.log_dir_paths)
        self.store = LocalMetadataStore(config.log_dir_paths[0])
        self.replicas = ReplicaManager(config.broker_id, self.log_manager)
        self.controller = Controller(
            config.broker_id,
            self.store,
            self.replicas,
            config.log_defaults,
            config.num_partitions,
            config.default_replication_factor,
            config.remote_log_storage_system_enable,
        )
        offsets = GroupMetadataManager(
            self.replicas,
            self.controller,
            OffsetsConfig(
                num_partitions=config.offsets_topic_num_partitions,
                retention_ms=config.offsets_retention_minutes * 60_000,
                metadata_max_bytes=config.offset_metadata_max_bytes,
            ),
        )
        self.registry = CollectorRegistry()
        self.groups = GroupCoordinator(
            GroupConfig(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                max_size=config.group_max_size,
            ),
            offsets,
            self._partition_exists,
        )
        self.remote: RemoteLogManager | None = None
        self.metrics_server = MetricsServer(
            self.registry, self._tier_status, self._refresh_remote_metrics
        )
        self.scheduler = Scheduler()
        self.socket_server = SocketServer(
            RequestDispatcher(
                BrokerContext(
                    config,
                    self.replicas,
                    self.controller,
                    self.groups,
                    BrokerTopicMetrics(self.registry),
                    self.endpoints,
                )
            ).handle,
            config.socket_request_max_bytes,
            config.queued_max_request_bytes,
            config.connection_limits,
        )
        self._stopped = False
        self.stop_requested = asyncio.Event()  # set by signals, or when every log dir failed
        self.fatal_error: str | None = None

    def _partition_exists(self, tp: TopicPartition) -> bool:
        return tp in self.replicas.partitions

    async def start(self) -> None:
        """Raises `LogDirsOffline` if no log dir could be loaded."""
        loop = asyncio.get_running_loop()
        self.log_manager.failure_channel.listeners.append(
            lambda log_dir, error: loop.call_soon_threadsafe(
                self._on_log_dir_offline, log_dir, error
            )
        )
        await loop.run_in_executor(
            None, partial(self.log_manager.load_logs, self.controller.config_for)
        )
        if self.fatal_error is not None or not self.log_manager.online_log_dirs:
            raise LogDirsOffline(self.fatal_error or "no log dir is online")
        self.controller.start()
        c = self.config
        if c.remote_log_storage_system_enable:
            self.remote = build_remote_log_manager(
                c, self.store.cluster_id, self.replicas, self.controller, self.registry
            )
            await self.remote.start(self._topic_exists)
            self.replicas.attach_remote_log_manager(self.remote)
            self.scheduler.schedule(
                "remote-log-metrics",
                self._remote_housekeeping,
                min(c.remote_log_manager_task_interval_ms, 10_000),
            )
        self.groups.start()
        self.scheduler.schedule(
            "log-retention", self._cleanup_logs, c.log_retention_check_interval_ms
        )
        self.scheduler.schedule(
            "flush-rolled-segments", self._flush_rolled, c.log_flush_offset_checkpoint_interval_ms
        )
        self.scheduler.schedule(
            "checkpoint", self._checkpoint, c.replica_high_watermark_checkpoint_interval_ms
        )
        self.scheduler.schedule(
            "offsets-retention", self._expire_offsets, c.offsets_retention_check_interval_ms
        )
        self.scheduler.schedule(
            "producer-id-expiration",
            self._expire_producers,
            c.producer_id_expiration_check_interval_ms,
        )
        if self.ports.metrics is not None:
            await self.metrics_server.start_on(self.ports.metrics)
        await self.socket_server.start_on(self.ports.broker)
        host = self.ports.broker.getsockname()[0]
        bound = f"[{host}]:{self.ports.port}" if ":" in host else f"{host}:{self.ports.port}"
        for line in startup_summary(c, self.endpoints, self.store.cluster_id, bound):
            log.info("%s", line)

    def _topic_exists(self, tip: TopicIdPartition) -> bool:
        topic = self.store.topics.get(tip.topic_partition.topic)
        return topic is not None and topic.topic_id == tip.topic_id

    def _tier_status(self) -> list[dict[str, Any]]:
        return self.remote.status() if self.remote is not None else []

    def _refresh_remote_metrics(self) -> None:
        if self.remote is not None:
            self.remote.update_metrics()

    async def _remote_housekeeping(self) -> None:
        assert self.remote is not None
        self.remote.update_metrics()
        self.remote.rlmm_snapshot()

    def _on_log_dir_offline(self, log_dir: Path, error: OSError) -> None:
        """Answer waiting fetches of the dir's partitions; stop if no log dir is left."""
        self.replicas.on_log_dir_offline(log_dir)
        if not self.log_manager.online_log_dirs and self.fatal_error is None:
            self.fatal_error = f"every log dir is offline; {log_dir} failed with {describe(error)}"
            log.error("stopping: %s", self.fatal_error)
            self.stop_requested.set()

    async def _cleanup_logs(self) -> None:
        self.log_manager.cleanup_logs()

    async def _flush_rolled(self) -> None:
        await self.log_manager.flush_rolled_segments()

    async def _checkpoint(self) -> None:
        """Offsets copied on the loop, written (and fsynced) in the default executor."""
        write = asyncio.get_running_loop().run_in_executor(
            None, self.log_manager.write_checkpoints, self.log_manager.checkpoint_offsets()
        )
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # stop() waits for the write, so the shutdown checkpoint is never overwritten by it.
            await asyncio.wait([write])
            raise

    async def _expire_offsets(self) -> None:
        self.groups.expire_offsets()

    async def _expire_producers(self) -> None:
        self.log_manager.remove_expired_producers(now_ms() - self.config.producer_id_expiration_ms)

    async def stop(self) -> None:
        """Idempotent; see the module docstring for the order."""
        if self._stopped:
            return
        self._stopped = True
        timeout_s = self.config.controlled_shutdown_timeout_ms / 1000
        log.info("shutting down")
        self.groups.stop()
        await self.socket_server.stop(timeout_s)
        await self.scheduler.stop()
        await self.metrics_server.stop()
        self.ports.close()  # if the start failed before listening on them
        if self.remote is not None:
            await self.remote.stop(timeout_s)
        self.log_manager.shutdown()
        log.info("shut down cleanly")
