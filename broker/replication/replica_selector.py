"""Which replica a consumer should fetch from (KIP-392), with Kafka's selector interface.

`replica.selector.class` names the selector: unset, the leader serves every consumer
(Kafka's default); `org.apache.kafka.common.replica.RackAwareReplicaSelector` (or just
`RackAwareReplicaSelector`) prefers a replica in the client's rack; any other value is
a dotted Python path to a class with this interface (`configure`, `select`, `close`).

The leader asks its selector only for consumer fetches of version 11 and up, among the
replicas Kafka deems eligible: in the ISR, with the fetch offset between their log start
and log end offsets (the leader always is). A choice other than the leader is answered
at once with that replica's id and no records.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tierbroker.storage.topic_partition import TopicPartition

RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
_SHORT_NAMES = {"RackAwareReplicaSelector": RACK_AWARE}


@dataclass(frozen=True, slots=True)
class ClientMetadata:
    rack_id: str
    client_id: str
    client_address: str
    principal: str = "User:ANONYMOUS"
    listener_name: str = "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class ReplicaView:
    endpoint: Node
    log_end_offset: int
    time_since_last_caught_up_ms: int


@dataclass(frozen=True, slots=True)
class PartitionView:
    replicas: Sequence[ReplicaView]
    leader: ReplicaView


class ReplicaSelector(Protocol):
    def configure(self, configs: Mapping[str, str]) -> None: ...

    def select(
        self, topic_partition: TopicPartition, client: ClientMetadata, partition: PartitionView
    ) -> ReplicaView | None:
        """The replica the client should fetch from; None (or the leader) for the leader."""

    def close(self) -> None: ...


class RackAwareReplicaSelector:
    """Kafka's: a replica in the client's rack (exact, case-sensitive), preferring the
    leader among them, then the highest log end offset, the shortest time since it last
    caught up, and the highest broker id; the leader when the client names no rack or no
    replica is in its rack."""

    def configure(self, configs: Mapping[str, str]) -> None:
        pass

    def select(
        self, topic_partition: TopicPartition, client: ClientMetadata, partition: PartitionView
    ) -> ReplicaView | None:
        if not client.rack_id:
            return partition.leader
        same_rack = [r for r in partition.replicas if r.endpoint.rack == client.rack_id]
        if not same_rack:
            return partition.leader
        if partition.leader in same_rack:
            return partition.leader
        return max(
            same_rack,
            key=lambda r: (r.log_end_offset, -r.time_since_last_caught_up_ms, r.endpoint.id),
        )

    def close(self) -> None:
        pass


def selector_class(name: str) -> type[ReplicaSelector]:
    """The class `replica.selector.class` names.

    Raises ValueError (naming the property and the accepted names) if it does not load."""
    name = _SHORT_NAMES.get(name, name)
    if name == RACK_AWARE:
        return RackAwareReplicaSelector
    module_name, _, class_name = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(
            f"replica.selector.class={name!r} cannot be loaded ({e}): use {RACK_AWARE}, "
            "RackAwareReplicaSelector, or a dotted path to a class with configure, select "
            "and close"
        ) from None
    if not isinstance(found, type):
        raise ValueError(f"replica.selector.class={name!r} is not a class")
    return found


def load_selector(name: str | None, configs: Mapping[str, str]) -> ReplicaSelector | None:
    """The selector `replica.selector.class` names, configured; None for the leader only."""
    if not name:
        return None
    selector = selector_class(name)()
    selector.configure(configs)
    return selector
