"""Building the remote tier from broker config: plugins by short name or class path, and the RLM.

`remote.log.storage.manager.class.name` is `localfs`, `s3`, or a dotted path
(`package.module.ClassName`) to any `RemoteStorageManager`; likewise
`remote.log.metadata.manager.class.name` is `topic` or a dotted path.
`remote.log.storage.manager.class.path` lists extra directories (`:`-separated)
to import plugins from, as Kafka's class path does for plugin jars.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tierbroker.broker.cluster.topic_admin import TopicAdmin
from tierbroker.broker.config import BrokerConfig, ConfigError
from tierbroker.broker.internal_topic import RemoteLogMetadataTopic
from tierbroker.broker.replica_manager import ReplicaManager
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.storage_manager import RemoteStorageManager
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager

STORAGE_MANAGERS = {
    "localfs": "tierbroker.storage.remote.local_fs.LocalFsRemoteStorageManager",
    "s3": "tierbroker.storage.remote.s3.S3RemoteStorageManager",
}


def load_class(path: str, property_name: str) -> Any:
    module_name, _, class_name = path.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{property_name}={path!r}: cannot load it: {e}") from e


def build_remote_log_manager(
    config: BrokerConfig,
    cluster_id: str,
    replicas: ReplicaManager,
    admin: TopicAdmin,
    registry: CollectorRegistry,
) -> RemoteLogManager:
    log_dir = config.log_dir_paths[0]
    for extra in (config.remote_log_storage_manager_class_path or "").split(":"):
        if extra and extra not in sys.path:
            sys.path.append(extra)
    name = config.remote_log_storage_manager_class_name
    rsm_class = load_class(
        STORAGE_MANAGERS.get(name, name), "remote.log.storage.manager.class.name"
    )
    rsm = rsm_class()
    if not isinstance(rsm, RemoteStorageManager):
        raise ConfigError(
            f"remote.log.storage.manager.class.name={name!r} is not a RemoteStorageManager"
        )
    rsm.configure(
        {
            "dir": str((log_dir / ".." / "remote").resolve()),
            "cluster.id": cluster_id,
            "broker.id": str(config.broker_id),
            **config.rsm_configs,
        }
    )
    rlmm = _metadata_manager(config, replicas, admin, log_dir)
    rlmm.configure(config.rlmm_configs)
    return RemoteLogManager(_rlm_config(config), config.broker_id, rsm, rlmm, log_dir, registry)


def _metadata_manager(
    config: BrokerConfig, replicas: ReplicaManager, admin: TopicAdmin, log_dir: Path
) -> RemoteLogMetadataManager:
    name = config.remote_log_metadata_manager_class_name
    if name == "topic":
        topic = RemoteLogMetadataTopic(
            config.remote_log_metadata_topic_num_partitions,
            config.remote_log_metadata_topic_replication_factor,
            replicas,
            admin,
        )
        return TopicBasedRemoteLogMetadataManager(topic, log_dir)
    rlmm = load_class(name, "remote.log.metadata.manager.class.name")()
    if not isinstance(rlmm, RemoteLogMetadataManager):
        raise ConfigError(
            f"remote.log.metadata.manager.class.name={name!r} is not a RemoteLogMetadataManager"
        )
    return rlmm


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
    )
