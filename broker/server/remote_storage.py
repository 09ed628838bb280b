"""Building the remote tier from broker config: plugins by short name or class path, and the RLM.

`remote.log.storage.manager.class.name` is `localfs`, `s3`, or a dotted path
(`package.module.ClassName`) to any `RemoteStorageManager`; likewise
`remote.log.metadata.manager.class.name` is `topic` (or Kafka's own class name for
it) or a dotted path. `remote.log.storage.manager.class.path` lists extra
directories (`:`-separated) to import plugins from, as Kafka's class path does for
plugin jars. The preflight loads the classes before the broker touches the disk, so
a name that does not load stops the start with one line listing the accepted names.

The LocalFs plugin's directory (`rsm.config.dir`) defaults to `remote/` inside the
first log dir: the data dir the user named holds both tiers. Its name cannot be
taken for a partition directory (`<topic>-<partition>`) when logs are loaded.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import cast

from prometheus_client import CollectorRegistry

from tierbroker.broker.config.broker_config import BrokerConfig, ConfigError
from tierbroker.broker.coordinator.internal_topic import RemoteLogMetadataTopic
from tierbroker.broker.metadata.topic_admin import TopicAdmin
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.remote.chunk_cache import ChunkCacheConfig
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.partition_index import TopicDescription
from tierbroker.storage.remote.storage_manager import RemoteStorageManager
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager

STORAGE_MANAGERS = {
    "localfs": "tierbroker.storage.remote.local_fs.LocalFsRemoteStorageManager",
    "s3": "tierbroker.storage.remote.s3.S3RemoteStorageManager",
}
TOPIC_BASED = "topic"
# Kafka's default for remote.log.metadata.manager.class.name: the same design as `topic`.
KAFKA_TOPIC_BASED = (
    "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"
)
LOCAL_REMOTE_DIR = "remote"  # inside the first log dir; never a `<topic>-<partition>` name
CHUNK_CACHE_DIR = "remote-chunk-cache"  # likewise


def local_remote_dir(config: BrokerConfig) -> Path:
    """Where the LocalFs plugin keeps the remote tier: `rsm.config.dir`, by default
    `remote/` inside the first log dir."""
    configured = config.rsm_configs.get("dir")
    return Path(configured) if configured else config.log_dir_paths[0] / LOCAL_REMOTE_DIR


def storage_manager_class(config: BrokerConfig) -> type[RemoteStorageManager]:
    """The class `remote.log.storage.manager.class.name` names; `ConfigError` if it does
    not load or is not a `RemoteStorageManager`."""
    for extra in (config.remote_log_storage_manager_class_path or "").split(":"):
        if extra and extra not in sys.path:
            sys.path.append(extra)
    return storage_manager_named(
        config.remote_log_storage_manager_class_name, "remote.log.storage.manager.class.name"
    )


def storage_manager_named(name: str, setting: str) -> type[RemoteStorageManager]:
    """The class `name` (a short name or `package.module.Class`) given by the property
    `setting`; `ConfigError` if it does not load or is not a `RemoteStorageManager`."""
    found = _load_class(
        STORAGE_MANAGERS.get(name, name),
        RemoteStorageManager,
        f"{setting}={name!r}",
        f"use {', '.join(STORAGE_MANAGERS)}, or package.module.Class of a RemoteStorageManager",
    )
    return cast(type[RemoteStorageManager], found)


def metadata_manager_class(config: BrokerConfig) -> type[RemoteLogMetadataManager] | None:
    """The class `remote.log.metadata.manager.class.name` names, None for the topic-based
    manager; `ConfigError` if it does not load or is not a `RemoteLogMetadataManager`."""
    name = config.remote_log_metadata_manager_class_name
    if name in (TOPIC_BASED, KAFKA_TOPIC_BASED):
        return None
    found = _load_class(
        name,
        RemoteLogMetadataManager,
        f"remote.log.metadata.manager.class.name={name!r}",
        f"use {TOPIC_BASED}, or package.module.Class of a RemoteLogMetadataManager",
    )
    return cast(type[RemoteLogMetadataManager], found)


def _load_class(path: str, base: type, setting: str, accepted: str) -> type:
    """The class at `path` (`package.module.Class`), if it is a subclass of `base`."""
    module_name, _, class_name = path.replace(":", ".").rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as e:
        reason = str(e) or type(e).__name__
        raise ConfigError(f"{setting}: cannot load it ({reason}): {accepted}") from None
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ConfigError(f"{setting}: not a {base.__name__}: {accepted}")
    return found


def build_remote_log_manager(
    config: BrokerConfig,
    cluster_id: str,
    replicas: ReplicaManager,
    admin: TopicAdmin,
    registry: CollectorRegistry,
) -> RemoteLogManager:
    log_dir = config.log_dir_paths[0]
    rsm = storage_manager_class(config)()
    rsm.configure(
        {
            "dir": str(local_remote_dir(config).resolve()),
            "cluster.id": cluster_id,
            "broker.id": str(config.broker_id),
            **config.rsm_configs,
        }
    )
    rlmm = _metadata_manager(config, replicas, admin, log_dir)
    rlmm.configure(config.rlmm_configs)
    return RemoteLogManager(
        _rlm_config(config),
        config.broker_id,
        rsm,
        rlmm,
        log_dir,
        registry,
        chunk_cache_config(config),
        describe_topic=lambda topic: _describe_topic(admin, topic),
    )


def _describe_topic(admin: TopicAdmin, topic: str) -> TopicDescription | None:
    """A topic's partition count and config overrides, as this broker's metadata has them."""
    assignment = admin.cache.topics.get(topic)
    if assignment is None:
        return None
    return TopicDescription(
        partition_count=len(assignment.partitions),
        configs=dict(admin.cache.configs.get(topic, {})),
    )


def chunk_cache_config(config: BrokerConfig) -> ChunkCacheConfig:
    """The remote read chunks' settings; `ConfigError` naming a bad one. A disk cache
    defaults to `remote-chunk-cache/` in the first log dir."""
    default_path = config.log_dir_paths[0] / CHUNK_CACHE_DIR
    try:
        return ChunkCacheConfig.from_configs(config.rsm_configs, default_path)
    except ValueError as e:
        raise ConfigError(f"rsm.config.{e}") from None


def _metadata_manager(
    config: BrokerConfig, replicas: ReplicaManager, admin: TopicAdmin, log_dir: Path
) -> RemoteLogMetadataManager:
    rlmm_class = metadata_manager_class(config)
    if rlmm_class is not None:
        return rlmm_class()
    topic = RemoteLogMetadataTopic(
        config.remote_log_metadata_topic_num_partitions,
        config.remote_log_metadata_topic_replication_factor,
        replicas,
        admin,
        brokers_may_join=config.metadata_store == "zookeeper",
    )
    return TopicBasedRemoteLogMetadataManager(topic, log_dir)


def _rlm_config(c: BrokerConfig) -> RemoteLogManagerConfig:
    return RemoteLogManagerConfig(
        task_interval_ms=c.remote_log_manager_task_interval_ms,
        task_retry_backoff_ms=c.remote_log_manager_task_retry_backoff_ms,
        task_retry_backoff_max_ms=c.remote_log_manager_task_retry_backoff_max_ms,
        copier_pool_size=c.remote_log_manager_copier_thread_pool_size,
        expiration_pool_size=c.remote_log_manager_expiration_thread_pool_size,
        follower_pool_size=c.remote_log_manager_follower_thread_pool_size,
        reader_threads=c.remote_log_reader_threads,
        reader_max_pending_tasks=c.remote_log_reader_max_pending_tasks,
        index_cache_bytes=c.remote_log_index_file_cache_total_size_bytes,
        fetch_max_wait_ms=c.remote_fetch_max_wait_ms,
        copy_max_bytes_per_second=c.remote_log_manager_copy_max_bytes_per_second,
        fetch_max_bytes_per_second=c.remote_log_manager_fetch_max_bytes_per_second,
        stuck_copy_timeout_ms=c.remote_log_manager_stuck_copy_timeout_ms,
        remote_call_timeout_ms=c.remote_log_manager_call_timeout_ms,
        custom_metadata_max_bytes=c.remote_log_metadata_custom_metadata_max_bytes,
    )
