"""A ReplicaManager of one broker for unit tests: its partitions made leaders by hand, as the
metadata would make them, with no broker around it."""

from __future__ import annotations

import asyncio
import uuid

from tierbroker.broker.metadata.inprocess_store import InProcessZooKeeper
from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.replication.partition import Partition
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

BROKER_ID = 0
LEADER = PartitionState(BROKER_ID, 0, (BROKER_ID,), 1, 0)


def replica_manager(log_manager: LogManager) -> ReplicaManager:
    session = InProcessZooKeeper(None).session()
    return ReplicaManager(BROKER_ID, log_manager, MetadataCache(session), session)


def lead_log(replicas: ReplicaManager, log: Log) -> Partition:
    """Make this broker the only replica and leader of `log`'s partition."""
    partition = Partition(log, BROKER_ID)
    partition.make_leader(LEADER, (BROKER_ID,))
    replicas.partitions[log.topic_partition] = partition
    return partition


def create_log(
    log_manager: LogManager, tp: TopicPartition, topic_id: uuid.UUID, config: LogConfig
) -> Log:
    """A new log, created as the broker creates them (outside a running event loop)."""
    asyncio.run(log_manager.create_logs([tp], topic_id, config, LEADER.leader_epoch))
    return log_manager.logs[tp]


def lead(
    replicas: ReplicaManager, tp: TopicPartition, topic_id: uuid.UUID, config: LogConfig
) -> Partition:
    return lead_log(replicas, create_log(replicas.log_manager, tp, topic_id, config))
