"""`Controller`: creates, changes and deletes topics, and tells the ReplicaManager.

One broker for now: it leads every partition at leader epoch 0. Every change is
written to the `MetadataStore` before replicas act on it, so a restart sees
whatever was acknowledged. CreateTopics and CreatePartitions create the new logs a
batch at a time, their files written in worker threads, so the event loop keeps
serving; one request may create at most `MAX_PARTITIONS_PER_REQUEST` partitions.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from tierbroker.broker.cluster.metadata_store import LocalMetadataStore, TopicRecord
from tierbroker.broker.replica_manager import ReplicaManager
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_dir_failure import describe
from tierbroker.storage.topic_configs import check_overrides, not_applied
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_NAME_LENGTH = 249
INITIAL_LEADER_EPOCH = 0
PRODUCER_ID_BLOCK_SIZE = 1000
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__remote_log_metadata"})
# Kafka's controller refuses a user operation of more than 10,000 metadata records
# (QuorumController.MAX_RECORDS_PER_USER_OP); here, one per new partition.
MAX_PARTITIONS_PER_REQUEST = 10_000
EXCESSIVE_BATCH_MESSAGE = "Unable to perform excessively large batch operation."
LEAD_BATCH_PARTITIONS = 256  # new logs registered at a time, between checks of the topic


def check_request_size(new_partitions: Sequence[int]) -> None:
    """POLICY_VIOLATION, as Kafka's controller, for a request creating too many partitions."""
    if sum(max(0, n) for n in new_partitions) > MAX_PARTITIONS_PER_REQUEST:
        raise KafkaError(ErrorCode.policy_violation, EXCESSIVE_BATCH_MESSAGE)


def validate_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise KafkaError(ErrorCode.invalid_topic_exception, f"topic name {name!r} is illegal")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"topic name of {len(name)} characters exceeds {MAX_TOPIC_NAME_LENGTH}",
        )
    if not LEGAL_TOPIC_NAME.fullmatch(name):
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"topic name {name!r} may only contain ASCII alphanumerics, '.', '_' and '-'",
        )


class Controller:
    def __init__(
        self,
        broker_id: int,
        store: LocalMetadataStore,
        replicas: ReplicaManager,
        log_defaults: Mapping[str, Any],
        default_partitions: int,
        default_replication_factor: int,
        tiering_enabled: bool = False,
    ) -> None:
        self.broker_id = broker_id
        self.store = store
        self.replicas = replicas
        self.log_defaults = dict(log_defaults)
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self._next_producer_id = self._producer_id_block_end = 0
        self.tiering_enabled = tiering_enabled

    @property
    def cluster_id(self) -> str:
        return self.store.cluster_id

    def log_config(self, topic: TopicRecord) -> LogConfig:
        return LogConfig.from_configs({**self.log_defaults, **check_overrides(topic.configs)})

    def config_for(self, tp: TopicPartition) -> LogConfig | None:
        topic = self.store.topics.get(tp.topic)
        if topic is None or tp.partition >= topic.partitions:
            return None
        return self.log_config(topic)

    def start(self) -> None:
        """Lead every partition of every known topic (logs are already loaded)."""
        for topic in self.store.topics.values():
            self._lead(topic, range(topic.partitions))

    def _lead(self, topic: TopicRecord, partitions: range) -> None:
        config = self.log_config(topic)
        for p in partitions:
            self.replicas.make_leader(
                TopicPartition(topic.name, p), topic.topic_id, config, INITIAL_LEADER_EPOCH
            )

    async def _lead_new(self, topic: TopicRecord, partitions: range) -> None:
        """Create the logs of new partitions in batches and lead them; stops if the topic
        is deleted meanwhile (DeleteTopics removes what was led so far)."""
        config = self.log_config(topic)
        log_manager = self.replicas.log_manager
        for start in range(partitions.start, partitions.stop, LEAD_BATCH_PARTITIONS):
            batch = range(start, min(start + LEAD_BATCH_PARTITIONS, partitions.stop))
            tps = [TopicPartition(topic.name, p) for p in batch]
            await log_manager.create_logs(tps, topic.topic_id, config, INITIAL_LEADER_EPOCH)
            current = self.store.topics.get(topic.name)
            if current is None or current.topic_id != topic.topic_id:
                for tp in tps:
                    created = log_manager.logs.get(tp)
                    if created is not None and created.topic_id == topic.topic_id:
                        log_manager.delete_log(tp)
                return
            self._lead(topic, batch)

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        validate_only: bool = False,
    ) -> TopicRecord:
        """Create a topic (-1 means the broker default), or raise with Kafka's error code.

        Its logs are created on the event loop: for topics created implicitly (Metadata,
        internal topics) with the default partition count.
        """
        topic = self._new_topic(name, partitions, replication_factor, configs, validate_only)
        if not validate_only:
            self._lead(topic, range(topic.partitions))
        return topic

    async def create_topic_batched(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        validate_only: bool = False,
    ) -> TopicRecord:
        """As `create_topic`, the logs created off the event loop (CreateTopics)."""
        topic = self._new_topic(name, partitions, replication_factor, configs, validate_only)
        if not validate_only:
            await self._lead_new(topic, range(topic.partitions))
        return topic

    def _new_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        validate_only: bool,
    ) -> TopicRecord:
        """Validate a new topic and, unless `validate_only`, store it."""
        validate_topic_name(name)
        if name in self.store.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        partitions = self.default_partitions if partitions == -1 else partitions
        replication_factor = (
            self.default_replication_factor if replication_factor == -1 else replication_factor
        )
        if partitions <= 0:
            raise KafkaError(
                ErrorCode.invalid_partitions, f"number of partitions must be > 0, got {partitions}"
            )
        if replication_factor <= 0:
            raise KafkaError(
                ErrorCode.invalid_replication_factor,
                f"replication factor must be > 0, got {replication_factor}",
            )
        if replication_factor > 1:
            raise KafkaError(
                ErrorCode.invalid_replication_factor,
                f"replication factor {replication_factor} is larger than the 1 available broker",
            )
        self._check_configs(configs, None)
        topic = TopicRecord(name, uuid.uuid4(), partitions, replication_factor, dict(configs))
        if not validate_only:
            with self._metadata_write(f"creating topic {name}"):
                self.store.put(topic)
            log.info("created topic %s (%s) with %d partitions", name, topic.topic_id, partitions)
            _note_not_applied(name, configs)
        return topic

    def delete_topic(self, name: str) -> TopicRecord:
        """Delete the topic's logs, then its record: the data goes first, so deleting frees
        space even on a full disk before the metadata write needs some. If that write
        fails (KAFKA_STORAGE_ERROR), a restart sees the topic again with empty logs and a
        retried delete completes."""
        topic = self.topic_or_error(name)
        for p in range(topic.partitions):
            self.replicas.stop_replica(TopicPartition(name, p), delete=True)
        with self._metadata_write(f"deleting topic {name}"):
            self.store.remove(name)
        log.info("deleted topic %s (%s)", name, topic.topic_id)
        return topic

    async def create_partitions(self, name: str, count: int, validate_only: bool) -> None:
        topic = self.topic_or_error(name)
        if count <= topic.partitions:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"topic {name!r} has {topic.partitions} partitions; {count} is not more",
            )
        if validate_only:
            return
        with self._metadata_write(f"adding partitions to {name}"):
            self.store.put(topic.with_changes(partitions=count))
        await self._lead_new(self.store.topics[name], range(topic.partitions, count))

    def alter_configs(self, name: str, configs: Mapping[str, str], validate_only: bool) -> None:
        """Replace the topic's config overrides with `configs` (already merged by the caller)."""
        topic = self.topic_or_error(name)
        self._check_configs(configs, self.log_config(topic))
        if validate_only:
            return
        updated = topic.with_changes(configs=dict(configs))
        with self._metadata_write(f"altering the configs of {name}"):
            self.store.put(updated)
        _note_not_applied(name, {k: v for k, v in configs.items() if topic.configs.get(k) != v})
        config = self.log_config(updated)
        for p in range(updated.partitions):
            self.replicas.update_config(TopicPartition(name, p), config)

    @contextmanager
    def _metadata_write(self, action: str) -> Iterator[None]:
        """A metadata-store write that fails (OSError) changed nothing: it takes its log dir
        offline, as any write there, and is answered KAFKA_STORAGE_ERROR."""
        try:
            yield
        except OSError as e:
            log_dir = self.store.path.parent
            self.replicas.log_manager.failure_channel.maybe_add_offline_log_dir(log_dir, e, action)
            raise KafkaError(
                ErrorCode.kafka_storage_error, f"{action}: {self.store.path}: {describe(e)}"
            ) from e

    def _check_configs(self, configs: Mapping[str, str], current: LogConfig | None) -> None:
        """Each override's name and value, then the topic's configs together, as Kafka
        checks them (`current`: the topic's configs before an alteration)."""
        overrides = check_overrides(configs)
        LogConfig.from_configs({**self.log_defaults, **overrides}).check()
        self._check_tiering(overrides, current)

    def _check_tiering(self, overrides: Mapping[str, Any], current: LogConfig | None) -> None:
        """remote.storage.enable needs the broker's remote tier; turning it off needs
        remote.log.delete.on.disable=true (KIP-950), since the remote data then goes."""
        wanted = overrides.get("remote.storage.enable", False)
        if wanted and not self.tiering_enabled:
            raise KafkaError(
                ErrorCode.invalid_config,
                "remote.storage.enable=true needs remote.log.storage.system.enable=true",
            )
        if current is not None and current.remote_storage_enable and not wanted:
            if not overrides.get("remote.log.delete.on.disable", False):
                raise KafkaError(
                    ErrorCode.invalid_config,
                    "turning remote.storage.enable off deletes the remote data: "
                    "set remote.log.delete.on.disable=true to confirm",
                )

    def next_producer_id(self) -> int:
        """A producer id never handed out before, also across restarts (ids go in blocks).

        Raises KAFKA_STORAGE_ERROR when a new block could not be written: no id is given out
        that a restart could give out again.
        """
        if self._next_producer_id >= self._producer_id_block_end:
            with self._metadata_write("allocating producer ids"):
                block = self.store.allocate_producer_id_block(PRODUCER_ID_BLOCK_SIZE)
            self._next_producer_id = block
            self._producer_id_block_end = self._next_producer_id + PRODUCER_ID_BLOCK_SIZE
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id

    def topic_or_error(self, name: str) -> TopicRecord:
        topic = self.store.topics.get(name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        return topic


def _note_not_applied(topic: str, configs: Mapping[str, str]) -> None:
    """One log line naming the configs just set that change nothing in tierbroker."""
    names = not_applied(configs)
    if names:
        log.info(
            "topic %s: %s accepted and stored, but without effect in tierbroker",
            topic,
            ", ".join(f"{n}={configs[n]}" for n in names),
        )
