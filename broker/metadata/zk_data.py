"""Kafka's znode layout and JSON, so Kafka engineers and `zkCli` can read the cluster's state.

| znode | kind | content |
|---|---|---|
| `/cluster/id` | persistent | `{"version":"1","id":...}`, created once |
| `/controller` | ephemeral | `{"version":1,"brokerid":N,"timestamp":ms}`: the active controller |
| `/controller_epoch` | persistent | the controller epoch; its version fences controller writes |
| `/brokers/ids/N` | ephemeral | the broker's registration; its czxid is the broker epoch |
| `/brokers/topics/T` | persistent | `{"version":3,"topic_id":...,"partitions":{"0":[1,2]},` |
| | | `"adding_replicas":{...},"removing_replicas":{...}}`: replicas of moves in progress |
| `/brokers/topics/T/partitions/P/state` | persistent | leader, leader epoch, ISR; version = epoch |
| `/config/topics/T` | persistent | `{"version":1,"config":{...}}`: the topic's overrides |
| `/config/brokers/E` | persistent | the same, for broker `E` or the cluster (`<default>`): |
| | | dynamic broker configs |
| `/config/users/U`, `/config/clients/C`, | persistent | the same: client quotas of a user, a |
| `/config/users/U/clients/C` | | client id or both (`<default>` too); `U` holds SCRAM |
| | | credentials too |
| `/config/changes/config_change_N` | persistent | `{"version":2,"entity_path":"users/U"}`: |
| | | a notice that an entity's configs changed (`config_changes`) |
| `/admin/delete_topics/T` | persistent | a deletion the controller carries out |
| `/latest_producer_id_block` | persistent | the last producer-id block handed out |
| `/tierbroker/controlled_shutdown/N` | ephemeral | broker N asks to have its leadership moved |

The last one is tierbroker's own: Kafka's ZooKeeper-mode brokers ask for a controlled
shutdown with an RPC the protocol library does not have.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any

from tierbroker.broker.config.listeners import (
    Listener,
    SecurityProtocol,
    parse_listener_list,
    parse_protocol_map,
)
from tierbroker.storage.checkpoints import kafka_uuid, parse_kafka_uuid

CLUSTER_ID = "/cluster/id"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
TOPIC_CONFIGS = "/config/topics"
BROKER_CONFIGS = "/config/brokers"
USER_CONFIGS = "/config/users"
CLIENT_CONFIGS = "/config/clients"
CONFIG_CHANGES = "/config/changes"
DEFAULT_BROKER_ENTITY = "<default>"  # the cluster-wide defaults' entity, as Kafka names it
DELETE_TOPICS = "/admin/delete_topics"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
CONTROLLED_SHUTDOWN = "/tierbroker/controlled_shutdown"
PERSISTENT_PATHS = (
    BROKER_IDS,
    TOPICS,
    TOPIC_CONFIGS,
    BROKER_CONFIGS,
    USER_CONFIGS,
    CLIENT_CONFIGS,
    CONFIG_CHANGES,
    DELETE_TOPICS,
    CONTROLLED_SHUTDOWN,
)

NO_LEADER = -1


def sanitize(name: str) -> str:
    """A user or client id as a znode name (Kafka's `Sanitizer.sanitize`: URL-encoded,
    `*` as %2A, `~` kept, space as %20)."""
    return urllib.parse.quote(name, safe="")


def desanitize(name: str) -> str:
    """The inverse of `sanitize` (Kafka's `Sanitizer.desanitize`)."""
    return urllib.parse.unquote_plus(name)


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def config_path(topic: str) -> str:
    return f"{TOPIC_CONFIGS}/{topic}"


def broker_config_path(entity: str) -> str:
    return f"{BROKER_CONFIGS}/{entity}"


def delete_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


def controlled_shutdown_path(broker_id: int) -> str:
    return f"{CONTROLLED_SHUTDOWN}/{broker_id}"


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _loads(data: bytes) -> dict[str, Any]:
    loaded = json.loads(data)
    if not isinstance(loaded, dict):
        raise ValueError(f"expected a JSON object, got {data[:80]!r}")
    return loaded


def now_text() -> str:
    return str(time.time_ns() // 1_000_000)


# What decoding a znode another tool wrote may raise: readers skip it, logged, until it
# changes (its watch is set before it is decoded).
UNDECODABLE = (ValueError, KeyError, TypeError, AttributeError)


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A live broker: its advertised endpoint on each listener, its rack and epoch."""

    broker_id: int
    endpoints: tuple[Listener, ...]
    rack: str | None = None
    epoch: int = -1  # the czxid of the registration; not in the JSON

    def endpoint(self, listener_name: str) -> Listener | None:
        return next((e for e in self.endpoints if e.name == listener_name), None)

    def encode(self) -> bytes:
        # Kafka's host and port are the PLAINTEXT listener's, for clients before 0.10.
        plaintext = self.endpoint(SecurityProtocol.PLAINTEXT.value)
        return _dumps(
            {
                "version": 5,
                "host": plaintext.host if plaintext else None,
                "port": plaintext.port if plaintext else -1,
                "endpoints": [str(e) for e in self.endpoints],
                "listener_security_protocol_map": {
                    e.name: e.security_protocol.value for e in self.endpoints
                },
                "rack": self.rack,
                "jmx_port": -1,
                "timestamp": now_text(),
                "features": {},
            }
        )

    @classmethod
    def decode(cls, broker_id: int, data: bytes, epoch: int) -> BrokerRegistration:
        value = _loads(data)
        protocols = parse_protocol_map(
            ",".join(f"{k}:{v}" for k, v in value.get("listener_security_protocol_map", {}).items())
            or None
        )
        endpoints = parse_listener_list(",".join(value["endpoints"]), "endpoints", protocols)
        return cls(broker_id, endpoints, value.get("rack"), epoch)


FIRST_LEADER_EPOCH_FIELD = "tierbroker_first_leader_epoch"


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """A topic's id and, per partition, its replicas in preference order.

    `first_leader_epoch`: the epoch the controller elects the partitions' first leaders
    in, above 0 only for a topic restored from its remote tier (`create_options`); the
    znode carries it (tierbroker's own field) only then."""

    topic_id: uuid.UUID
    partitions: dict[int, tuple[int, ...]]
    adding_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    first_leader_epoch: int = 0

    def encode(self) -> bytes:
        def replicas(of: dict[int, tuple[int, ...]]) -> dict[str, list[int]]:
            return {str(p): list(r) for p, r in sorted(of.items())}

        value: dict[str, object] = {
            "version": 3,
            "topic_id": kafka_uuid(self.topic_id),
            "partitions": replicas(self.partitions),
            "adding_replicas": replicas(self.adding_replicas),
            "removing_replicas": replicas(self.removing_replicas),
        }
        if self.first_leader_epoch:
            value[FIRST_LEADER_EPOCH_FIELD] = self.first_leader_epoch
        return _dumps(value)

    @classmethod
    def decode(cls, data: bytes) -> TopicAssignment:
        value = _loads(data)

        def replicas(name: str) -> dict[int, tuple[int, ...]]:
            return {int(p): tuple(int(b) for b in r) for p, r in value.get(name, {}).items()}

        return cls(
            parse_kafka_uuid(value["topic_id"]),
            replicas("partitions"),
            replicas("adding_replicas"),
            replicas("removing_replicas"),
            int(value.get(FIRST_LEADER_EPOCH_FIELD, 0)),
        )


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Who leads a partition, in which leader epoch, with which in-sync replicas.

    `partition_epoch` is the version of the state znode (not in the JSON): every write
    of the state names the version it replaces, so concurrent writers cannot both win.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    partition_epoch: int = -1

    def encode(self) -> bytes:
        return _dumps(
            {
                "controller_epoch": self.controller_epoch,
                "leader": self.leader,
                "version": 1,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
                "leader_recovery_state": 0,
            }
        )

    @classmethod
    def decode(cls, data: bytes, partition_epoch: int) -> PartitionState:
        value = _loads(data)
        return cls(
            int(value["leader"]),
            int(value["leader_epoch"]),
            tuple(int(b) for b in value["isr"]),
            int(value["controller_epoch"]),
            partition_epoch,
        )


def encode_config(configs: dict[str, str]) -> bytes:
    return _dumps({"version": 1, "config": dict(sorted(configs.items()))})


def decode_config(data: bytes) -> dict[str, str]:
    return {str(k): str(v) for k, v in _loads(data).get("config", {}).items()}


def encode_controller(broker_id: int) -> bytes:
    return _dumps({"version": 1, "brokerid": broker_id, "timestamp": now_text()})


def decode_controller(data: bytes) -> int:
    return int(_loads(data)["brokerid"])


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dumps({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return str(_loads(data)["id"])


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    broker_id: int
    first: int
    last: int

    def encode(self) -> bytes:
        return _dumps(
            {
                "version": 1,
                "broker": self.broker_id,
                "block_start": str(self.first),
                "block_end": str(self.last),
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> ProducerIdBlock:
        value = _loads(data)
        return cls(int(value["broker"]), int(value["block_start"]), int(value["block_end"]))
