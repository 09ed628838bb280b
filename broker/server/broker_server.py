"""`BrokerServer`: one broker of a cluster, built from its config and a `MetadataStore` session.

It is given its ports bound by the preflight (`BoundPorts`), so it knows the address it
advertises (`endpoints`: a configured port of 0 is the one bound) before it starts.

Start: open the store session (the cluster id is created once, or checked against
`cluster.id`), read the cluster's metadata, load and recover the logs it still assigns
here, listen, register (an ephemeral `/brokers/ids/N` with the bound port; its creating
transaction is the broker epoch), take the partitions the metadata assigns here (as
leader or follower), stand for controller, then start the remote tier, the group
coordinator, the log cleaner, background jobs and the metrics endpoint, and log a summary
(`startup_summary`).

Stop (idempotent, in this order, all within `shutdown.timeout.ms`): a controlled shutdown
(the controller moves this broker's leadership to other ISR members and takes it out of
ISRs, so producers and consumers move before it goes), stop coordinating groups, answer
parked fetches, stop listening and finish requests in hand, stop background jobs and the
metrics endpoint, stop fetching and resign as controller, stop the remote tier and the
log cleaner, finish removing deleted logs' files, flush and checkpoint every log, and
close the session (the registration goes with it). When the controlled shutdown fails
(its retries spent, or the store unreachable) or the timeout passes, the shutdown goes
on uncontrolled: the session is closed at once, so nothing waits for the store any
more, and the logs are still flushed and checkpointed; `shutdown_error` says why.

A log dir that fails (an I/O error) goes offline and its partitions answer
KAFKA_STORAGE_ERROR; when no log dir is left online the broker asks to be stopped
(`stop_requested`, with `fatal_error` saying which dir failed and why), as Kafka
halts, and stops in the same order, leaving the offline dirs untouched.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.controller.controller import Controller
from tierbroker.broker.controller.leader_election import LeaderBalance
from tierbroker.broker.coordinator.group.coordinator import GroupConfig, GroupCoordinator
from tierbroker.broker.coordinator.group.offsets_store import (
    OFFSETS_TOPIC,
    GroupMetadataManager,
    OffsetsConfig,
)
from tierbroker.broker.coordinator.transaction.coordinator import TransactionCoordinator
from tierbroker.broker.coordinator.transaction.marker_channel import (
    TransactionMarkerChannelManager,
)
from tierbroker.broker.coordinator.transaction.state_manager import (
    TRANSACTION_STATE_TOPIC,
    TransactionConfig,
    TransactionStateManager,
)
from tierbroker.broker.coordinator.transaction.verification import TransactionVerifier
from tierbroker.broker.handlers import RequestDispatcher
from tierbroker.broker.handlers.common import BrokerContext
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.acl_store import AclStore
from tierbroker.broker.metadata.dynamic_broker_config import DynamicBrokerConfig
from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.metadata.scram_credentials import ScramCredentialStore
from tierbroker.broker.metadata.store import (
    MetadataStore,
    NodeExistsError,
    StoreError,
)
from tierbroker.broker.metadata.topic_admin import TopicAdmin
from tierbroker.broker.metadata.zk_data import BrokerRegistration
from tierbroker.broker.metrics.cleaner_metrics import CleanerMetrics
from tierbroker.broker.metrics.metrics_server import MetricsServer
from tierbroker.broker.metrics.replication_metrics import ReplicationMetrics
from tierbroker.broker.metrics.served_bytes import ServedBytesMeter
from tierbroker.broker.metrics.tier_usage import tier_usage
from tierbroker.broker.metrics.topic_metrics import BrokerTopicMetrics
from tierbroker.broker.network.endpoints import BrokerEndpoints, broker_endpoints
from tierbroker.broker.network.socket_server import SocketServer
from tierbroker.broker.network.socket_server_metrics import SocketServerMetrics
from tierbroker.broker.quota.quota_managers import QuotaManagers
from tierbroker.broker.quota.quota_store import ClientQuotaStore
from tierbroker.broker.quota.rate import QuotaWindow
from tierbroker.broker.replication.partition import Partition
from tierbroker.broker.replication.replica_fetcher import FetcherConfig
from tierbroker.broker.replication.replica_manager import ReplicaManager, ReplicationConfig
from tierbroker.broker.replication.replica_selector import load_selector
from tierbroker.broker.security.authorizer.authorizer import Authorizer, AuthorizerConfig
from tierbroker.broker.server.broker_lifecycle import BrokerLifecycle, RegistrationError
from tierbroker.broker.server.listener_sasl import sasl_settings
from tierbroker.broker.server.listener_security import (
    inter_broker_channel,
    listener_security,
    listener_ssl,
)
from tierbroker.broker.server.preflight import BoundPorts
from tierbroker.broker.server.remote_storage import build_remote_log_manager
from tierbroker.broker.server.scheduler import Scheduler
from tierbroker.broker.server.startup_summary import startup_summary
from tierbroker.protocol.records.control import EndTxnMarker
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.log import now_ms
from tierbroker.storage.log_cleaner import CleanerConfig, LogCleaner
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_dir_failure import describe
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class LogDirsOffline(Exception):
    """No log dir is online: the broker cannot serve a partition and must stop."""


class StartupError(Exception):
    """The broker cannot join its cluster; the message says why and what to fix."""


class BrokerServer:
    def __init__(self, config: BrokerConfig, store: MetadataStore, ports: BoundPorts) -> None:
        """`ports`: bound by `preflight` (or `bind_ports`); the broker closes them."""
        self.config = config
        self.store = store
        self.ports = ports
        self.endpoints: BrokerEndpoints = broker_endpoints(
            config, ports.listener_ports, ports.metrics_port
        )
        self.cache = MetadataCache(store)
        self.quota_store = ClientQuotaStore(store)
        self.authorizer, self.acl_store = _authorizer(config, store)
        self.scram_credentials = ScramCredentialStore(store)
        self.log_manager = LogManager(
            config.log_dir_paths, min_free_bytes=config.log_dir_min_free_bytes
        )
        self.listener_ssl = listener_ssl(config)
        self.dynamic_config = DynamicBrokerConfig(
            config.broker_id, store, self.cache, config.log_defaults, self.listener_ssl
        )
        self.cache.add_listener(self.dynamic_config.maybe_reconfigure_listeners)
        self.admin = TopicAdmin(
            config.broker_id,
            store,
            self.cache,
            self.dynamic_config.log_defaults,
            config.num_partitions,
            config.default_replication_factor,
            config.remote_log_storage_system_enable,
        )
        self.replicas = ReplicaManager(
            config.broker_id,
            self.log_manager,
            self.cache,
            store,
            _replication_config(config),
            self.admin.log_config,
        )
        self.admin.applied_here = self.replicas.applied
        self.controller = self._controller()
        self.cleaner = LogCleaner(self.log_manager, _cleaner_config(config))
        self.registry = CollectorRegistry()
        topic_metrics = self._register_metrics()
        self._build_coordinators()
        self.remote: RemoteLogManager | None = None
        self.metrics_server = self._metrics_server(topic_metrics)
        self.scheduler = Scheduler()
        self.socket_server = self._socket_server(topic_metrics)
        self.lifecycle = BrokerLifecycle(
            config.broker_id, config.broker_rack, store, self.cache, self.replicas
        )
        self.registration: BrokerRegistration | None = None
        self._started = False
        self._stopped = False
        self.stop_requested = asyncio.Event()  # set by signals, or when every log dir failed
        self.fatal_error: str | None = None
        self.shutdown_error: str | None = None  # why the shutdown went uncontrolled
        self._closing: asyncio.Task[None] | None = None  # closing the store session

    def _register_metrics(self) -> BrokerTopicMetrics:
        """The cleaner's and replication's metrics in the registry; the topics' returned."""
        CleanerMetrics(self.cleaner, self.registry)
        replication_metrics = ReplicationMetrics(self.replicas, self.controller, self.registry)
        self.replicas.isr_change_listeners.append(replication_metrics.isr_changed)
        topic_metrics = BrokerTopicMetrics(self.registry)
        self.replicas.stop_listeners.append(topic_metrics.forget)
        return topic_metrics

    def _controller(self) -> Controller:
        c = self.config
        return Controller(
            c.broker_id,
            self.store,
            lambda topic: self.admin.log_config(topic).unclean_leader_election_enable,
            LeaderBalance(
                c.auto_leader_rebalance_enable,
                c.leader_imbalance_check_interval_seconds,
                c.leader_imbalance_per_broker_percentage,
            ),
        )

    def _metrics_server(self, topic_metrics: BrokerTopicMetrics) -> MetricsServer:
        return MetricsServer(
            self.registry,
            self._tier_status,
            self._tier_health,
            self.cleaner.status,
            self._refresh_remote_metrics,
            tier_usage=lambda: self._tier_usage(topic_metrics.served),
        )

    def _build_coordinators(self) -> None:
        """The group and transaction coordinators, on this broker's internal topics."""
        c = self.config
        offsets = GroupMetadataManager(self.replicas, self.admin, _offsets_config(c))
        self.groups = GroupCoordinator(_group_config(c), offsets, self._partition_exists)
        inter_broker = self.replicas.config.inter_broker
        self.transactions = TransactionCoordinator(
            TransactionStateManager(self.replicas, self.admin, _transaction_config(c)),
            TransactionMarkerChannelManager(
                self.replicas, self.cache, c.request_timeout_ms, inter_broker
            ),
            self.admin.next_producer_id,
        )
        self.verifier = TransactionVerifier(
            c.broker_id, self.transactions, self.cache, c.request_timeout_ms, inter_broker
        )
        self.replicas.verify_transaction = self.verifier.verify
        self.replicas.leadership_listeners.append(self._on_leadership)
        self.replicas.txn_marker_listeners.append(self._on_txn_marker)

    def _socket_server(self, topic_metrics: BrokerTopicMetrics) -> SocketServer:
        c = self.config
        context = BrokerContext(
            c,
            self.replicas,
            self.cache,
            self.admin,
            self.dynamic_config,
            self.groups,
            self.transactions,
            self.controller,
            topic_metrics,
            self.endpoints,
            QuotaManagers.create(
                self.quota_store,
                QuotaWindow(c.quota_window_num, c.quota_window_size_seconds * 1000),
            ),
            self.authorizer,
            self.acl_store,
            scram_credentials=self.scram_credentials,
        )
        return SocketServer(
            RequestDispatcher(context).handle,
            c.socket_request_max_bytes,
            c.queued_max_request_bytes,
            c.connection_limits,
            listener_security(
                c, self.listener_ssl, sasl_settings(c, self.scram_credentials.lookup)
            ),
            SocketServerMetrics(self.registry),
        )

    @property
    def broker_id(self) -> int:
        return self.config.broker_id

    @property
    def running(self) -> bool:
        """Started and not stopped (nor stopping)."""
        return self._started and not self._stopped

    def _on_leadership(self, partition: Partition, leader: bool) -> None:
        tp = partition.topic_partition
        if tp.topic == OFFSETS_TOPIC:
            self.groups.on_leadership(tp.partition, leader)
        elif tp.topic == TRANSACTION_STATE_TOPIC:
            self.transactions.on_leadership(tp.partition, leader, partition.leader_epoch)

    def _on_txn_marker(self, tp: TopicPartition, producer_id: int, marker: EndTxnMarker) -> None:
        if tp.topic == OFFSETS_TOPIC:
            self.groups.store.complete_transaction(tp.partition, producer_id, not marker.is_abort)

    def _partition_exists(self, tp: TopicPartition) -> bool:
        return tp.topic in self.cache.topics and tp.partition < self.cache.partition_count(tp.topic)

    # Start ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Raises `LogDirsOffline` if no log dir could be loaded, `StartupError` if the broker
        cannot join its cluster."""
        await self.join()
        await self.serve()

    async def join(self) -> None:
        """Load the logs, listen and register: the controller may place replicas here now."""
        loop = asyncio.get_running_loop()
        settings = self.config.model_dump(by_alias=True)
        self.replicas.reader.selector = load_selector(  # its class checked by the preflight
            self.config.replica_selector_class,
            {k: str(v) for k, v in settings.items() if v is not None},
        )
        self.log_manager.failure_channel.listeners.append(
            lambda log_dir, error: loop.call_soon_threadsafe(
                self._on_log_dir_offline, log_dir, error
            )
        )
        await self.store.start()
        await self._join_cluster()
        await self.cache.start()
        await self.quota_store.start()
        if self.acl_store is not None:  # read whole before the first request is authorized
            await self.acl_store.start()
        await self.scram_credentials.start()  # read whole before the first login
        await loop.run_in_executor(None, partial(self.log_manager.load_logs, self._config_for))
        if self.fatal_error is not None or not self.log_manager.online_log_dirs:
            raise LogDirsOffline(self.fatal_error or "no log dir is online")
        for listener in self.config.listener_config.listeners:
            self.socket_server.listen_on(self.ports.listeners[listener.name], listener)
        try:
            self.registration = await self.lifecycle.register(self.endpoints.listeners)
        except RegistrationError as e:
            raise StartupError(str(e)) from None

    async def serve(self) -> None:
        """Take the partitions assigned here, stand for controller, start everything else."""
        await self.replicas.start()
        await self.controller.start()
        c = self.config
        if c.remote_log_storage_system_enable:
            self.remote = build_remote_log_manager(
                c, self.cache.cluster_id, self.replicas, self.admin, self.registry
            )
            await self.remote.start(self._topic_exists)
            self.replicas.attach_remote_log_manager(self.remote)
            self.scheduler.schedule(
                "remote-log-metrics",
                self._remote_housekeeping,
                min(c.remote_log_manager_task_interval_ms, 10_000),
            )
        self.groups.start()
        self.cleaner.start()
        self._schedule_jobs()
        if self.ports.metrics is not None:
            await self.metrics_server.start_on(self.ports.metrics)
        await self.replicas.applied.wait()
        await self.socket_server.start()
        self._started = True
        for line in startup_summary(c, self.endpoints, self.cache.cluster_id, self.ports):
            log.info("%s", line)

    async def _join_cluster(self) -> None:
        """Create the cluster id and the persistent znodes on first start; check `cluster.id`."""
        for path in zk.PERSISTENT_PATHS:
            if await self.store.exists(path) is None:
                try:
                    await self.store.create(path, make_parents=True)
                except NodeExistsError:
                    pass
        wanted = self.config.cluster_id or _new_cluster_id()
        try:
            await self.store.create(zk.CLUSTER_ID, zk.encode_cluster_id(wanted), make_parents=True)
            log.info("created cluster %s", wanted)
        except NodeExistsError:
            data, _ = await self.store.get(zk.CLUSTER_ID)
            existing = zk.decode_cluster_id(data)
            if self.config.cluster_id and existing != self.config.cluster_id:
                raise StartupError(
                    f"cluster.id={self.config.cluster_id} does not match the cluster's id "
                    f"{existing} in the metadata store: fix cluster.id or the store's address"
                ) from None

    def _config_for(self, tp: TopicPartition, topic_id: uuid.UUID) -> LogConfig | None:
        """The config of a log found on disk, if its topic (with that id) is assigned here."""
        assignment = self.cache.topics.get(tp.topic)
        if assignment is None or assignment.topic_id != topic_id:
            return None
        if self.broker_id not in assignment.partitions.get(tp.partition, ()):
            return None
        return self.admin.log_config(tp.topic)

    def _schedule_jobs(self) -> None:
        c = self.config
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
            "isr-expiration", self._shrink_isr, max(1, c.replica_lag_time_max_ms // 2)
        )
        self.scheduler.schedule(
            "offsets-retention", self._expire_offsets, c.offsets_retention_check_interval_ms
        )
        self.scheduler.schedule(
            "abort-timed-out-transactions",
            self.transactions.abort_timed_out_transactions,
            c.transaction_abort_timed_out_transaction_cleanup_interval_ms,
        )
        self.scheduler.schedule(
            "remove-expired-transactional-ids",
            self.transactions.remove_expired_transactional_ids,
            c.transaction_remove_expired_transaction_cleanup_interval_ms,
        )
        self.scheduler.schedule(
            "producer-id-expiration",
            self._expire_producers,
            c.producer_id_expiration_check_interval_ms,
        )

    def _topic_exists(self, tip: TopicIdPartition) -> bool:
        assignment = self.cache.topics.get(tip.topic_partition.topic)
        return assignment is not None and assignment.topic_id == tip.topic_id

    def _tier_status(self) -> list[dict[str, Any]]:
        return self.remote.status() if self.remote is not None else []

    def _tier_usage(self, served: ServedBytesMeter) -> dict[str, Any]:
        remote_bytes: dict[str, int] = {}
        for row in self._tier_status():
            remote_bytes[row["topic"]] = remote_bytes.get(row["topic"], 0) + row["remote_bytes"]
        object_store = self.remote.rsm.meter.usage() if self.remote is not None else {}
        return tier_usage(object_store, served.usage(), remote_bytes)

    def _tier_health(self) -> dict[str, Any]:
        if self.remote is None:
            return {"state": "disabled", "error": None, "since_ms": -1}
        return self.remote.storage_health()

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

    async def _shrink_isr(self) -> None:
        self.replicas.maybe_shrink_isr()

    async def _expire_offsets(self) -> None:
        await self.groups.offsets.expire()

    async def _expire_producers(self) -> None:
        self.log_manager.remove_expired_producers(now_ms() - self.config.producer_id_expiration_ms)

    # Stop ----------------------------------------------------------------------------

    async def stop(self, controlled: bool = True) -> None:
        """Idempotent; see the module docstring for the order. `controlled=False` skips the
        controlled shutdown (the whole cluster is stopping). A shutdown that cannot finish
        within `shutdown.timeout.ms` goes on uncontrolled; `shutdown_error` says why."""
        if self._stopped:
            return
        self._stopped = True
        c = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + c.shutdown_timeout_ms / 1000

        def left() -> float:
            return max(0.0, deadline - loop.time())

        log.info("broker %d shutting down", self.broker_id)
        self.replicas.fetchers.begin_shutdown()
        failed = f"shutdown did not complete within shutdown.timeout.ms={c.shutdown_timeout_ms}"
        if controlled and self._started and c.controlled_shutdown_enable:
            why = await self.lifecycle.controlled_shutdown(
                deadline,
                c.controlled_shutdown_max_retries,
                c.controlled_shutdown_retry_backoff_ms / 1000,
            )
            if why is not None:
                failed = (
                    f"controlled shutdown did not complete (shutdown.timeout.ms="
                    f"{c.shutdown_timeout_ms}, controlled.shutdown.max.retries="
                    f"{c.controlled_shutdown_max_retries})"
                )
                self._abandon_store(why)
        # Past the deadline the store is closed: every call still waiting on it fails.
        watchdog = loop.call_at(
            deadline, self._abandon_store, "the metadata store did not answer in time"
        )
        await self.groups.stop()
        await self.transactions.stop()
        await self.verifier.close()
        self.replicas.fetch_purgatory.complete_all()  # long polls answer now, not at max wait
        await self.socket_server.stop(left())
        await self.scheduler.stop()
        await self.metrics_server.stop()
        self.ports.close()  # if the start failed before listening on them
        await self.lifecycle.close()
        await self.replicas.stop()
        await self.controller.stop()
        await self.quota_store.close()
        await self.scram_credentials.close()
        await self.cache.close()
        if self.acl_store is not None:
            await self.acl_store.close()
        if self.remote is not None:
            await self.remote.stop(left())
        await self.cleaner.stop(left())
        await self.log_manager.wait_deletions(left())
        self.log_manager.shutdown()
        watchdog.cancel()
        if self._closing is None:
            self._closing = loop.create_task(self._close_store())
        await self._closing
        if self.shutdown_error is None:
            log.info("broker %d shut down cleanly", self.broker_id)
            return
        self.shutdown_error = (
            f"{failed}: {self.shutdown_error}; shut down uncontrolled, logs flushed"
        )
        log.warning("broker %d: %s", self.broker_id, self.shutdown_error)

    def _abandon_store(self, why: str) -> None:
        """Wait for the metadata store no more: close its session now (once)."""
        if self._closing is not None:
            return
        self.shutdown_error = why
        log.warning(
            "broker %d: shutting down uncontrolled (%s), without waiting for the metadata store",
            self.broker_id,
            why,
        )
        self._closing = asyncio.get_running_loop().create_task(self._close_store())

    async def _close_store(self) -> None:
        try:
            await self.store.close()
        except StoreError as e:  # the registration goes with the session anyway
            log.warning("broker %d: closing the metadata store session: %s", self.broker_id, e)

    async def crash(self) -> None:
        """Go as a killed process does: tasks cancelled, sockets and files closed, but no
        log flushed, no checkpoint, remote-metadata snapshot or `.kafka_cleanshutdown`
        written and no znode deleted.
        The session is the caller's to abandon (a dead process stops heartbeating), so the
        controller learns of the crash only when it expires; the next start recovers the
        logs. Idempotent with `stop`."""
        if self._stopped:
            return
        self._stopped = True
        log.warning(
            "broker %d crashing: no flush, checkpoint or controlled shutdown", self.broker_id
        )
        await self.groups.stop()
        await self.transactions.stop()
        await self.verifier.close()
        await self.socket_server.stop(0)
        await self.scheduler.stop()
        await self.metrics_server.stop()
        self.ports.close()
        await self.lifecycle.close()
        await self.replicas.stop()
        await self.controller.stop()
        await self.quota_store.close()
        await self.scram_credentials.close()
        await self.cache.close()
        if self.acl_store is not None:
            await self.acl_store.close()
        if self.remote is not None:
            await self.remote.stop(0, crash=True)
        await self.cleaner.stop(0)
        for lg in self.log_manager.logs.values():
            for segment in lg.segments:
                segment.close()


def _authorizer(c: BrokerConfig, store: MetadataStore) -> tuple[Authorizer | None, AclStore | None]:
    """The authorizer `authorizer.class.name` asks for (checked by the preflight) and the
    store of its ACLs; (None, None) without one."""
    config = AuthorizerConfig.from_properties(c.security.values)
    if config is None:
        return None, None
    authorizer = Authorizer(config)
    return authorizer, AclStore(store, authorizer.acls)


def _replication_config(c: BrokerConfig) -> ReplicationConfig:
    fetcher = FetcherConfig(
        wait_max_ms=c.replica_fetch_wait_max_ms,
        min_bytes=c.replica_fetch_min_bytes,
        max_bytes=c.replica_fetch_max_bytes,
        response_max_bytes=c.replica_fetch_response_max_bytes,
        backoff_ms=c.replica_fetch_backoff_ms,
        socket_timeout_ms=c.replica_socket_timeout_ms,
        last_tiered_offset_enable=c.follower_fetch_last_tiered_offset_enable,
    )
    return ReplicationConfig(
        inter_broker=inter_broker_channel(c),
        replica_lag_time_max_ms=c.replica_lag_time_max_ms,
        fetcher=fetcher,
        # Followers serve consumers committed data: tell them the HW at once.
        propagate_high_watermark=c.replica_selector_class is not None,
    )


def _cleaner_config(c: BrokerConfig) -> CleanerConfig:
    return CleanerConfig(
        enable=c.log_cleaner_enable,
        threads=c.log_cleaner_threads,
        dedupe_buffer_size=c.log_cleaner_dedupe_buffer_size,
        io_buffer_load_factor=c.log_cleaner_io_buffer_load_factor,
        io_max_bytes_per_second=c.log_cleaner_io_max_bytes_per_second,
        backoff_ms=c.log_cleaner_backoff_ms,
    )


def _offsets_config(c: BrokerConfig) -> OffsetsConfig:
    return OffsetsConfig(
        num_partitions=c.offsets_topic_num_partitions,
        replication_factor=c.offsets_topic_replication_factor,
        retention_ms=c.offsets_retention_minutes * 60_000,
        metadata_max_bytes=c.offset_metadata_max_bytes,
        segment_bytes=c.offsets_topic_segment_bytes,
    )


def _transaction_config(c: BrokerConfig) -> TransactionConfig:
    return TransactionConfig(
        num_partitions=c.transaction_state_log_num_partitions,
        replication_factor=c.transaction_state_log_replication_factor,
        min_isr=c.transaction_state_log_min_isr,
        segment_bytes=c.transaction_state_log_segment_bytes,
        max_timeout_ms=c.transaction_max_timeout_ms,
        id_expiration_ms=c.transactional_id_expiration_ms,
        request_timeout_ms=c.request_timeout_ms,
        transaction_version=c.transaction_version,
    )


def _group_config(c: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        min_session_timeout_ms=c.group_min_session_timeout_ms,
        max_session_timeout_ms=c.group_max_session_timeout_ms,
        initial_rebalance_delay_ms=c.group_initial_rebalance_delay_ms,
        max_size=c.group_max_size,
    )


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
