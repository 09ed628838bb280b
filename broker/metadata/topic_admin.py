"""`TopicAdmin`: topic changes a client asks any broker for, written to the `MetadataStore`.

As Kafka's ZooKeeper-mode brokers do (`AdminZkClient`): the broker that gets a
CreateTopics validates it, places the replicas (`placement`) and writes the topic's
configs, then its assignment; the controller sees the new topic and elects its leaders.
CreatePartitions rewrites the assignment (conditionally on its version), DeleteTopics
writes a deletion request, the config APIs rewrite `/config/topics/T`. Each call returns
once this broker's `MetadataCache` shows the result (leaders elected, topic gone, configs
changed) or the timeout passes (REQUEST_TIMED_OUT, the change still happens).
A write the service could not store (a full disk under the in-process store) is
KAFKA_STORAGE_ERROR; one it did not answer is REQUEST_TIMED_OUT.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.create_options import NO_OPTIONS, CreateOptions
from tierbroker.broker.metadata.inprocess_store import StorageUnavailable
from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.metadata.placement import assign_replicas
from tierbroker.broker.metadata.store import (
    BadVersionError,
    ConnectionLossError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    StoreError,
    put,
)
from tierbroker.broker.metadata.zk_data import ProducerIdBlock, TopicAssignment
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.checkpoints import kafka_uuid
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_configs import check_overrides, not_applied

log = logging.getLogger(__name__)

LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_NAME_LENGTH = 249
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__remote_log_metadata"})
# Kafka's controller refuses a user operation of more than 10,000 metadata records
# (QuorumController.MAX_RECORDS_PER_USER_OP); here, one per new partition.
MAX_PARTITIONS_PER_REQUEST = 10_000
EXCESSIVE_BATCH_MESSAGE = "Unable to perform excessively large batch operation."
PRODUCER_ID_BLOCK_SIZE = 1000


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


def store_error(action: str, error: StoreError) -> KafkaError:
    """The error a client sees when a metadata write failed."""
    if isinstance(error, StorageUnavailable):
        return KafkaError(ErrorCode.kafka_storage_error, f"{action}: {error}")
    if isinstance(error, ConnectionLossError | SessionExpiredError):
        return KafkaError(ErrorCode.request_timed_out, f"{action}: {error}")
    return KafkaError(ErrorCode.unknown_server_error, f"{action}: {error}")


class TopicAdmin:
    def __init__(
        self,
        broker_id: int,
        store: MetadataStore,
        cache: MetadataCache,
        log_defaults: Callable[[], Mapping[str, Any]],
        default_partitions: int,
        default_replication_factor: int,
        tiering_enabled: bool = False,
    ) -> None:
        self.broker_id = broker_id
        self.store = store
        self.cache = cache
        self.log_defaults = log_defaults  # the topic defaults in force (they change)
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self.tiering_enabled = tiering_enabled
        self._next_producer_id = self._producer_id_block_end = 0
        # Set while this broker has applied every metadata change it saw (its replicas).
        self.applied_here: asyncio.Event | None = None

    def log_config(self, topic: str) -> LogConfig:
        return LogConfig.from_configs(
            {**self.log_defaults(), **check_overrides(self.cache.configs.get(topic, {}))}
        )

    def topic_or_error(self, name: str) -> TopicAssignment:
        assignment = self.cache.topics.get(name)
        if assignment is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        return assignment

    # CreateTopics --------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        *,
        assignment: Mapping[int, Sequence[int]] | None = None,
        validate_only: bool = False,
        timeout_s: float = 30.0,
        max_replication_factor: int | None = None,
        options: CreateOptions = NO_OPTIONS,
    ) -> TopicAssignment:
        """Create a topic (-1: the broker default), or raise with Kafka's error code.

        `max_replication_factor` caps the factor at the live brokers instead of refusing
        it (internal topics, as Kafka creates `__consumer_offsets`). `options`: a given
        topic id and first leader epoch (`create_options`, a restore's)."""
        validate_topic_name(name)
        if name in self.cache.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        if options.topic_id is not None:
            self._check_id_unused(options.topic_id)
        racks = {b: r.rack for b, r in self.cache.brokers.items()}
        if assignment:
            replicas = self._checked_assignment(assignment, racks)
        else:
            partitions = self.default_partitions if partitions == -1 else partitions
            if replication_factor == -1:
                replication_factor = self.default_replication_factor
            if max_replication_factor is not None:
                replication_factor = max(1, min(replication_factor, len(racks)))
            if partitions <= 0:
                raise KafkaError(
                    ErrorCode.invalid_partitions,
                    f"number of partitions must be > 0, got {partitions}",
                )
            if replication_factor <= 0:
                raise KafkaError(
                    ErrorCode.invalid_replication_factor,
                    f"replication factor must be > 0, got {replication_factor}",
                )
            replicas = assign_replicas(racks, partitions, replication_factor)
        self._check_configs(configs, None)
        topic = TopicAssignment(
            options.topic_id or uuid.uuid4(),
            replicas,
            first_leader_epoch=options.first_leader_epoch,
        )
        if validate_only:
            return topic
        action = f"creating topic {name}"
        try:
            if await self.store.exists(zk.delete_path(name)) is not None:
                raise KafkaError(
                    ErrorCode.topic_already_exists, f"topic {name!r} is marked for deletion"
                )
            await put(self.store, zk.config_path(name), zk.encode_config(dict(configs)))
            await self.store.create(zk.topic_path(name), topic.encode(), make_parents=True)
        except NodeExistsError:
            raise KafkaError(
                ErrorCode.topic_already_exists, f"topic {name!r} already exists"
            ) from None
        except StoreError as e:
            raise store_error(action, e) from e
        log.info(
            "created topic %s (%s) with %d partitions, replication factor %d",
            name,
            kafka_uuid(topic.topic_id),
            len(replicas),
            len(next(iter(replicas.values()))),
        )
        _note_not_applied(name, configs)
        await self._wait(
            lambda: self._created(name, topic.topic_id), timeout_s, f"topic {name!r} created"
        )
        return topic

    def _check_id_unused(self, topic_id: uuid.UUID) -> None:
        """A topic id names one topic: its remote data and metadata are keyed by it."""
        for name, topic in self.cache.topics.items():
            if topic.topic_id == topic_id:
                raise KafkaError(
                    ErrorCode.topic_already_exists,
                    f"topic id {kafka_uuid(topic_id)} is already topic {name!r}'s",
                )

    def _created(self, name: str, topic_id: uuid.UUID) -> bool:
        current = self.cache.topics.get(name)
        return current is not None and current.topic_id == topic_id and self.cache.has_leaders(name)

    def _checked_assignment(
        self, assignment: Mapping[int, Sequence[int]], racks: Mapping[int, str | None]
    ) -> dict[int, tuple[int, ...]]:
        if sorted(assignment) != list(range(len(assignment))):
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"partitions must be numbered 0 to {len(assignment) - 1}",
            )
        sizes = {len(r) for r in assignment.values()}
        for p, replicas in assignment.items():
            if not replicas or len(set(replicas)) != len(replicas):
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"partition {p}: replicas {list(replicas)} are empty or repeat a broker",
                )
            unknown = [b for b in replicas if b not in racks]
            if unknown:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"partition {p}: brokers {unknown} are not live",
                )
        if len(sizes) != 1:
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                "every partition must have the same number of replicas",
            )
        return {p: tuple(r) for p, r in assignment.items()}

    # CreatePartitions ----------------------------------------------------------------

    async def create_partitions(
        self,
        name: str,
        count: int,
        assignment: Sequence[Sequence[int]] | None,
        validate_only: bool,
        timeout_s: float = 30.0,
    ) -> None:
        topic = self.topic_or_error(name)
        if topic.adding_replicas or topic.removing_replicas:
            # As Kafka: the controller rewrites the topic's assignment while it moves one.
            raise KafkaError(
                ErrorCode.reassignment_in_progress,
                f"A partition reassignment is in progress for the topic '{name}'.",
            )
        current = len(topic.partitions)
        if count <= current:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"topic {name!r} has {current} partitions; {count} is not more",
            )
        racks = {b: r.rack for b, r in self.cache.brokers.items()}
        factor = len(topic.partitions[0])
        if assignment:
            if len(assignment) != count - current:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"{len(assignment)} assignments for {count - current} new partitions",
                )
            added = self._checked_assignment(dict(enumerate(assignment)), racks)
            added = {current + p: r for p, r in added.items()}
        else:
            added = assign_replicas(racks, count - current, factor, first_partition=current)
        if validate_only:
            return
        updated = TopicAssignment(
            topic.topic_id,
            {**topic.partitions, **added},
            topic.adding_replicas,
            topic.removing_replicas,
        )
        try:
            data, stat = await self.store.get(zk.topic_path(name))
            if TopicAssignment.decode(data) != topic:
                raise KafkaError(
                    ErrorCode.reassignment_in_progress, f"topic {name!r} changed meanwhile"
                )
            await self.store.set(zk.topic_path(name), updated.encode(), stat.version)
        except (BadVersionError, NoNodeError) as e:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition, f"topic {name!r} changed meanwhile"
            ) from e
        except StoreError as e:
            raise store_error(f"adding partitions to {name}", e) from e
        await self._wait(
            lambda: self.cache.partition_count(name) >= count and self.cache.has_leaders(name),
            timeout_s,
            f"partitions of {name!r} created",
        )

    # DeleteTopics --------------------------------------------------------------------

    async def delete_topic(self, name: str, timeout_s: float = 30.0) -> uuid.UUID:
        topic = self.topic_or_error(name)
        try:
            await self.store.create(zk.delete_path(name), make_parents=True)
        except NodeExistsError:
            pass  # already asked for
        except StoreError as e:
            raise store_error(f"deleting topic {name}", e) from e
        await self._wait(
            lambda: (
                self.cache.topics.get(name, None) is None
                or self.cache.topics[name].topic_id != topic.topic_id
            ),
            timeout_s,
            f"topic {name!r} deleted",
        )
        log.info("deleted topic %s (%s)", name, kafka_uuid(topic.topic_id))
        return topic.topic_id

    # Configs -------------------------------------------------------------------------

    async def alter_configs(
        self, name: str, configs: Mapping[str, str], validate_only: bool, timeout_s: float = 30.0
    ) -> None:
        """Replace the topic's config overrides with `configs` (already merged by the caller)."""
        self.topic_or_error(name)
        self._check_configs(configs, self.log_config(name))
        if validate_only:
            return
        before = self.cache.configs.get(name, {})
        try:
            await put(self.store, zk.config_path(name), zk.encode_config(dict(configs)))
        except StoreError as e:
            raise store_error(f"altering the configs of {name}", e) from e
        _note_not_applied(name, {k: v for k, v in configs.items() if before.get(k) != v})
        wanted = dict(configs)
        await self._wait(
            lambda: self.cache.configs.get(name) == wanted, timeout_s, f"configs of {name!r}"
        )

    def _check_configs(self, configs: Mapping[str, str], current: LogConfig | None) -> None:
        """Each override's name and value, then the topic's configs together, as Kafka
        checks them (`current`: the topic's configs before an alteration)."""
        overrides = check_overrides(configs)
        LogConfig.from_configs({**self.log_defaults(), **overrides}).check()
        self._check_tiering(overrides, current)

    def _check_tiering(self, overrides: Mapping[str, Any], current: LogConfig | None) -> None:
        """Kafka's rules and words (LogConfig): remote.storage.enable needs the broker's
        remote tier; turning it off needs remote.log.delete.on.disable=true (KIP-950), since
        the remote data then goes; remote.log.copy.disable=true keeps it read-only instead."""
        wanted = overrides.get("remote.storage.enable", False)
        if wanted and not self.tiering_enabled:
            raise KafkaError(
                ErrorCode.invalid_config,
                "Tiered Storage functionality is disabled in the broker. "
                "Topic cannot be configured with remote log storage.",
            )
        if current is not None and current.remote_storage_enable and not wanted:
            if not overrides.get("remote.log.delete.on.disable", False):
                raise KafkaError(
                    ErrorCode.invalid_config,
                    "It is invalid to disable remote storage without deleting remote data. "
                    "If you want to keep the remote data and turn to read only, please set "
                    "`remote.storage.enable=true,remote.log.copy.disable=true`. If you want to "
                    "disable remote storage and delete all remote data, please set "
                    "`remote.storage.enable=false,remote.log.delete.on.disable=true`.",
                )

    # Producer ids --------------------------------------------------------------------

    async def next_producer_id(self) -> int:
        """A producer id never handed out before in the cluster, also across restarts: ids
        come in blocks claimed from `/latest_producer_id_block` by a versioned write.

        COORDINATOR_NOT_AVAILABLE when a block cannot be claimed: no id is given out that
        another broker or a restart could give out again."""
        if self._next_producer_id >= self._producer_id_block_end:
            block = await self._claim_producer_id_block()
            self._next_producer_id, self._producer_id_block_end = block.first, block.last + 1
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id

    async def _claim_producer_id_block(self) -> ProducerIdBlock:
        for _ in range(20):
            try:
                try:
                    data, stat = await self.store.get(zk.PRODUCER_ID_BLOCK)
                    last = ProducerIdBlock.decode(data).last
                    version = stat.version
                except NoNodeError:
                    last, version = -1, -1
                block = ProducerIdBlock(self.broker_id, last + 1, last + PRODUCER_ID_BLOCK_SIZE)
                if version < 0:
                    await self.store.create(zk.PRODUCER_ID_BLOCK, block.encode())
                else:
                    await self.store.set(zk.PRODUCER_ID_BLOCK, block.encode(), version)
                return block
            except (BadVersionError, NodeExistsError):
                continue  # another broker claimed one first: claim the next
            except StoreError as e:
                raise KafkaError(
                    ErrorCode.coordinator_not_available, f"allocating producer ids: {e}"
                ) from e
        raise KafkaError(
            ErrorCode.coordinator_not_available, "allocating producer ids: too much contention"
        )

    # Helpers -------------------------------------------------------------------------

    async def _wait(self, condition: Any, timeout_s: float, what: str) -> None:
        """Until the cache shows the change and this broker applied it (a client's next
        request here finds the new partitions led), or REQUEST_TIMED_OUT."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        if await self.cache.wait_until(condition, timeout_s):
            if self.applied_here is None:
                return
            try:
                async with asyncio.timeout_at(deadline):
                    await self.applied_here.wait()
                return
            except TimeoutError:
                pass
        raise KafkaError(ErrorCode.request_timed_out, f"{what}: not seen within {timeout_s:.0f} s")


def _note_not_applied(topic: str, configs: Mapping[str, str]) -> None:
    """One log line naming the configs just set that change nothing in tierbroker."""
    names = not_applied(configs)
    if names:
        log.info(
            "topic %s: %s accepted and stored, but without effect in tierbroker",
            topic,
            ", ".join(f"{n}={configs[n]}" for n in names),
        )
