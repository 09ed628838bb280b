"""`WireAdmin`: the admin requests librdkafka cannot send, through the broker's own client.

librdkafka has no AlterPartitionReassignments, and names no broker resource without a
broker id (the cluster's dynamic defaults). Metadata from a bootstrap broker names the
controller, each broker's address and each partition's replicas; the controller answers
AlterPartitionReassignments and ListPartitionReassignments (`tierbroker partition
reassign`, as for Kafka's `kafka-reassign-partitions.sh`), and a broker its own configs
or, any broker, the cluster's (`tierbroker cluster config`, as `kafka-configs.sh`).
librdkafka has no transaction admin either: `brokers`, `leader` and
`transaction_coordinator` name the brokers `tierbroker txn` asks (`broker.cli.transactions`).
The ACL requests (`tierbroker acl`) go this way too: librdkafka drops DescribeAcls' error
code, so a refusal would read as an empty list.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from kio.schema.alter_partition_reassignments.v0 import request as alter
from kio.schema.create_acls.v3 import request as create_acls
from kio.schema.delete_acls.v3 import request as delete_acls
from kio.schema.describe_acls.v3 import request as describe_acls
from kio.schema.describe_configs.v4 import request as describe
from kio.schema.find_coordinator.v4 import request as find
from kio.schema.incremental_alter_configs.v1 import request as incremental
from kio.schema.list_partition_reassignments.v0 import request as listing
from kio.schema.metadata.v12 import request as metadata
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta

from tierbroker.broker.cli.command_config import wire_security
from tierbroker.broker.cli.common import fail
from tierbroker.broker.network.broker_client import BrokerClient, BrokerClients
from tierbroker.broker.security.authorizer.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierbroker.protocol.errors import ErrorCode

CLIENT_ID = "tierbroker-cli"
T = TypeVar("T")
BROKER_RESOURCE = 4
TRANSACTION_KEY = i8(1)  # FindCoordinator's key type of a transactional id
SET, DELETE = 0, 1  # IncrementalAlterConfigs operations
CONFIG_SOURCES = {
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
}


class BrokerConfigEntry(NamedTuple):
    name: str
    value: str | None
    source: str  # Kafka's name of the config source: STATIC_BROKER_CONFIG, ...


def _resource_name(broker_id: int | None) -> str:
    return "" if broker_id is None else str(broker_id)


@dataclass(frozen=True)
class Move:
    """A partition and the replicas it should have; None cancels its reassignment."""

    topic: str
    partition: int
    replicas: tuple[int, ...] | None

    @property
    def name(self) -> str:
        return f"{self.topic}:{self.partition}"


@dataclass(frozen=True)
class Ongoing:
    """A reassignment in progress, as ListPartitionReassignments shows it."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def parse_move(spec: str) -> Move:
    """`topic:partition=1,2,3`, or `topic:partition` (no target: for a cancel)."""
    name, has_target, target = spec.partition("=")
    topic, _, number = name.rpartition(":")
    if not topic or not number.isdigit():
        raise ValueError(f"{spec!r} is not TOPIC:PARTITION[=BROKER,...]")
    if not has_target:
        return Move(topic, int(number), None)
    try:
        replicas = tuple(int(b) for b in target.split(","))
    except ValueError:
        raise ValueError(f"{spec!r}: replicas are broker ids separated by commas") from None
    return Move(topic, int(number), replicas)


class WireError(Exception):
    """The request failed as a whole: the brokers unreachable, or an error for all of it."""


def error_text(code: ErrorCode, message: str | None) -> str:
    """A Kafka error as its name, and the broker's reason when it gave one."""
    name = code.name.upper()
    return f"{name}: {message}" if message else name


class WireAdmin:
    """One command's connections: to a bootstrap broker, and to the brokers it names."""

    def __init__(self, bootstrap: str, timeout_s: float) -> None:
        self.bootstrap = bootstrap
        self.timeout_ms = max(int(timeout_s * 1000), 1)
        # One connection a broker, secured as `--command-config` says.
        self._clients = BrokerClients(CLIENT_ID, self.timeout_ms, wire_security())

    async def close(self) -> None:
        await self._clients.close()

    async def _metadata(self, topics: Sequence[str]) -> MetadataResponse:
        """Metadata from the first bootstrap broker that answers."""
        error: Exception | None = None
        for address in self.bootstrap.split(","):
            host, _, port = address.strip().rpartition(":")
            if not host or not port.isdigit():
                raise WireError(f"{address!r} is not host:port")
            try:
                answer: MetadataResponse = await self._clients.get(host, int(port)).send(
                    metadata.MetadataRequest(
                        topics=tuple(
                            metadata.MetadataRequestTopic(topic_id=None, name=TopicName(t))
                            for t in sorted(set(topics))
                        ),
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False,
                    )
                )
                return answer
            except OSError as e:  # BrokerUnavailable is one
                error = e
        raise WireError(f"cannot reach {self.bootstrap} ({error})")

    async def replicas(self, topics: Sequence[str]) -> dict[tuple[str, int], tuple[int, ...]]:
        """Each existing partition of `topics` and its replicas, in order."""
        answer = await self._metadata(topics)
        return {
            (str(t.name), int(p.partition_index)): tuple(int(b) for b in p.replica_nodes)
            for t in answer.topics
            if t.error_code == ErrorCode.none
            for p in t.partitions
        }

    async def _node(self, broker_id: int | None, topics: Sequence[str] = ()) -> BrokerClient:
        """A client of broker `broker_id`, or of the controller (None)."""
        answer = await self._metadata(topics)
        return self._client_of(answer, answer.controller_id if broker_id is None else broker_id)

    def _client_of(self, answer: MetadataResponse, broker_id: int) -> BrokerClient:
        for broker in answer.brokers:
            if broker.node_id == broker_id:
                return self._clients.get(broker.host, int(broker.port))
        raise WireError(
            f"{self.bootstrap} names no "
            + ("controller" if broker_id < 0 else f"broker {broker_id}")
        )

    async def any_broker(self) -> BrokerClient:
        """A client of the first bootstrap broker that answers Metadata."""
        answer = await self._metadata(())
        if not answer.brokers:
            raise WireError(f"{self.bootstrap} names no broker")
        return self._client_of(answer, answer.brokers[0].node_id)

    async def brokers(self) -> dict[int, BrokerClient]:
        """A client of each broker in the cluster, by id."""
        answer = await self._metadata(())
        return {
            int(b.node_id): self._clients.get(b.host, int(b.port))
            for b in sorted(answer.brokers, key=lambda b: b.node_id)
        }

    async def leader(self, topic: str, partition: int) -> BrokerClient:
        """A client of the partition's leader."""
        answer = await self._metadata([topic])
        for t in answer.topics:
            if t.error_code != ErrorCode.none:
                raise WireError(f"topic {topic}: {error_text(t.error_code, None)}")
            for p in t.partitions:
                if p.partition_index == partition and p.leader_id >= 0:
                    return self._client_of(answer, int(p.leader_id))
        raise WireError(f"{topic}:{partition} has no leader")

    async def transaction_coordinator(self, transactional_id: str) -> tuple[int, BrokerClient]:
        """The id and a client of the broker coordinating `transactional_id`."""
        answer = await (await self._node(None)).send(
            find.FindCoordinatorRequest(
                key_type=TRANSACTION_KEY, coordinator_keys=(transactional_id,)
            )
        )
        [found] = answer.coordinators
        if found.error_code != ErrorCode.none:
            raise WireError(error_text(found.error_code, found.error_message))
        return int(found.node_id), self._clients.get(found.host, int(found.port))

    # Broker configs ------------------------------------------------------------------

    async def broker_configs(self, broker_id: int | None) -> list[BrokerConfigEntry]:
        """A broker's configs, or (None) the cluster's dynamic defaults, by name."""
        client = await self._node(broker_id)
        answer = await client.send(
            describe.DescribeConfigsRequest(
                resources=(
                    describe.DescribeConfigsResource(
                        resource_type=i8(BROKER_RESOURCE),
                        resource_name=_resource_name(broker_id),
                        configuration_keys=None,
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            )
        )
        [result] = answer.results
        if result.error_code != ErrorCode.none:
            raise WireError(error_text(result.error_code, result.error_message))
        return sorted(
            BrokerConfigEntry(c.name, c.value, CONFIG_SOURCES.get(c.config_source, "UNKNOWN"))
            for c in result.configs
        )

    async def alter_broker_configs(
        self, broker_id: int | None, set_: Mapping[str, str], delete: Sequence[str]
    ) -> None:
        """Set and delete dynamic configs of a broker, or (None) of the cluster."""
        client = await self._node(broker_id)
        changes: list[tuple[str, int, str | None]] = [(n, SET, v) for n, v in set_.items()]
        changes += [(name, DELETE, None) for name in delete]
        answer = await client.send(
            incremental.IncrementalAlterConfigsRequest(
                resources=(
                    incremental.AlterConfigsResource(
                        resource_type=i8(BROKER_RESOURCE),
                        resource_name=_resource_name(broker_id),
                        configs=tuple(
                            incremental.AlterableConfig(
                                name=name, config_operation=i8(operation), value=value
                            )
                            for name, operation, value in changes
                        ),
                    ),
                ),
                validate_only=False,
            )
        )
        [result] = answer.responses
        if result.error_code != ErrorCode.none:
            raise WireError(error_text(result.error_code, result.error_message))

    # Reassignments -------------------------------------------------------------------

    async def alter_reassignments(self, moves: Sequence[Move]) -> dict[Move, str | None]:
        """Start (or, with no target, cancel) each move; its error, or None."""
        controller = await self._node(None, [m.topic for m in moves])
        by_topic: dict[str, list[Move]] = {}
        for move in moves:
            by_topic.setdefault(move.topic, []).append(move)
        answer = await controller.send(
            alter.AlterPartitionReassignmentsRequest(
                timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.timeout_ms)),
                topics=tuple(
                    alter.ReassignableTopic(
                        name=TopicName(topic),
                        partitions=tuple(
                            alter.ReassignablePartition(
                                partition_index=i32(m.partition),
                                replicas=None
                                if m.replicas is None
                                else tuple(BrokerId(b) for b in m.replicas),
                            )
                            for m in group
                        ),
                    )
                    for topic, group in by_topic.items()
                ),
            )
        )
        if answer.error_code != ErrorCode.none:
            raise WireError(error_text(answer.error_code, answer.error_message))
        errors = {
            (str(t.name), int(p.partition_index)): None
            if p.error_code == ErrorCode.none
            else error_text(p.error_code, p.error_message)
            for t in answer.responses
            for p in t.partitions
        }
        return {m: errors.get((m.topic, m.partition), "no answer") for m in moves}

    async def ongoing_reassignments(self, moves: Sequence[Move]) -> dict[tuple[str, int], Ongoing]:
        """The reassignments in progress among `moves`' partitions."""
        controller = await self._node(None, [m.topic for m in moves])
        partitions: dict[str, set[int]] = {}
        for move in moves:
            partitions.setdefault(move.topic, set()).add(move.partition)
        answer = await controller.send(
            listing.ListPartitionReassignmentsRequest(
                timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.timeout_ms)),
                topics=tuple(
                    listing.ListPartitionReassignmentsTopics(
                        name=TopicName(topic), partition_indexes=tuple(i32(p) for p in sorted(ps))
                    )
                    for topic, ps in partitions.items()
                ),
            )
        )
        if answer.error_code != ErrorCode.none:
            raise WireError(error_text(answer.error_code, answer.error_message))
        return {
            (str(t.name), int(p.partition_index)): Ongoing(
                tuple(int(b) for b in p.replicas),
                tuple(int(b) for b in p.adding_replicas),
                tuple(int(b) for b in p.removing_replicas),
            )
            for t in answer.topics
            for p in t.partitions
        }


def _binding(resource: Any, entry: Any) -> AclBinding:
    return AclBinding(
        ResourcePattern(
            ResourceType(resource.resource_type),
            resource.resource_name,
            PatternType(resource.pattern_type),
        ),
        AccessControlEntry(
            entry.principal,
            entry.host,
            AclOperation(entry.operation),
            AclPermissionType(entry.permission_type),
        ),
    )


def _filter_fields(selected: AclBindingFilter) -> dict[str, Any]:
    return {
        "resource_type_filter": i8(selected.resource_type),
        "resource_name_filter": selected.name,
        "pattern_type_filter": i8(selected.pattern_type),
        "principal_filter": selected.principal,
        "host_filter": selected.host,
        "operation": i8(selected.operation),
        "permission_type": i8(selected.permission_type),
    }


async def describe_acl_bindings(admin: WireAdmin, selected: AclBindingFilter) -> list[AclBinding]:
    """DescribeAcls: the ACLs `selected` matches."""
    client = await admin.any_broker()
    answer = await client.send(describe_acls.DescribeAclsRequest(**_filter_fields(selected)))
    if answer.error_code != ErrorCode.none:
        raise WireError(error_text(answer.error_code, answer.error_message))
    return [_binding(r, e) for r in answer.resources for e in r.acls]


async def create_acl_bindings(admin: WireAdmin, bindings: Sequence[AclBinding]) -> list[str | None]:
    """CreateAcls: each binding's error, None for one created."""
    client = await admin.any_broker()
    answer = await client.send(
        create_acls.CreateAclsRequest(
            creations=tuple(
                create_acls.AclCreation(
                    resource_type=i8(b.pattern.resource_type),
                    resource_name=b.pattern.name,
                    resource_pattern_type=i8(b.pattern.pattern_type),
                    principal=b.entry.principal,
                    host=b.entry.host,
                    operation=i8(b.entry.operation),
                    permission_type=i8(b.entry.permission_type),
                )
                for b in bindings
            )
        )
    )
    return [
        None if r.error_code == ErrorCode.none else error_text(r.error_code, r.error_message)
        for r in answer.results
    ]


async def delete_acl_bindings(
    admin: WireAdmin, filters: Sequence[AclBindingFilter]
) -> list[AclBinding]:
    """DeleteAcls: the ACLs deleted; WireError naming the first failure."""
    client = await admin.any_broker()
    answer = await client.send(
        delete_acls.DeleteAclsRequest(
            filters=tuple(delete_acls.DeleteAclsFilter(**_filter_fields(f)) for f in filters)
        )
    )
    deleted = []
    for result in answer.filter_results:
        if result.error_code != ErrorCode.none:
            raise WireError(error_text(result.error_code, result.error_message))
        for acl in result.matching_acls:
            if acl.error_code != ErrorCode.none:
                raise WireError(error_text(acl.error_code, acl.error_message))
            deleted.append(_binding(acl, acl))
    return deleted


def run_admin(
    what: str, bootstrap: str, timeout_s: float, call: Callable[[WireAdmin], Awaitable[T]]
) -> T:
    """`call` on a `WireAdmin`, its connections closed after; a failure is one `error:`
    line naming `what`, and exit 1."""

    async def run() -> T:
        admin = WireAdmin(bootstrap, timeout_s)
        try:
            return await call(admin)
        finally:
            await admin.close()

    try:
        return asyncio.run(run())
    except (OSError, WireError) as e:
        fail(f"{what}: {e}")
