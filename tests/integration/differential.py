"""The harness of the differential suite: one wire connection per broker, answers made
comparable, and the paths where two answers differ.

`Side` sends kio requests to one broker and creates the topics a scenario needs.
`comparable` turns a kio response into plain data, normalising only what differs between
any two brokers by nature: topic ids, node ids, hosts, ports, the cluster id, throttle
times and the text of error messages (where Kafka gives a non-empty one, tierbroker must
give one too). `differences` lists the paths ("topics[0].error_code") where two
comparable answers differ.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
import uuid
from collections.abc import Iterator
from typing import Any

from tests.integration.waiting import wait_for
from tests.integration.wire import (
    WireClient,
    create_topic,
    make,
    request_module,
    split_batches,
)
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import BatchView

# Ids a broker picks for itself; compared as "id" (set) or the zero UUID (unset).
_NODE_FIELDS = frozenset(
    {"node_id", "leader_id", "controller_id", "broker_id", "replica_nodes", "isr_nodes"}
)
_DROPPED = frozenset({"throttle_time", "throttle_time_ms", "host", "port", "cluster_id"})


class Side:
    """One broker under comparison: a wire connection and the broker's own node id."""

    def __init__(self, name: str, port: int, node_id: int) -> None:
        self.name = name
        self.client = WireClient(port, timeout_s=30.0)
        self.node_id = node_id

    def request(self, entity: Any) -> Any:
        return self.client.request(entity)

    def create_topic(
        self, name: str, partitions: int = 1, configs: dict[str, str] | None = None
    ) -> uuid.UUID:
        """Create `name` (replication factor 1) and wait until its leader answers
        ListOffsets for every partition, so produce and fetch find it."""
        topic_id = create_topic(self.client, name, partitions, configs)
        wait_for(
            lambda: all(
                self.list_offsets(name, -1, p).error_code == ErrorCode.none
                for p in range(partitions)
            ),
            f"{name} to have a leader on {self.name}",
            timeout_s=30,
        )
        return topic_id

    def list_offsets(
        self, topic: str, timestamp: int, partition: int = 0, current_leader_epoch: int = -1
    ) -> Any:
        """ListOffsets v9 of one partition, asked as a consumer: the partition's answer."""
        m = request_module(2, 9)
        response = self.request(
            m.ListOffsetsRequest(
                replica_id=-1,
                isolation_level=0,
                topics=(
                    m.ListOffsetsTopic(
                        name=topic,
                        partitions=(
                            m.ListOffsetsPartition(
                                partition_index=partition,
                                current_leader_epoch=current_leader_epoch,
                                timestamp=timestamp,
                            ),
                        ),
                    ),
                ),
            )
        )
        return response.topics[0].partitions[0]

    def produce(self, topic: str, records: bytes, partition: int = 0, acks: int = -1) -> Any:
        """Produce v11: the partition's answer."""
        m = request_module(0, 11)
        response = self.request(
            make(
                m.ProduceRequest,
                transactional_id=None,
                acks=acks,
                timeout=datetime.timedelta(seconds=10),
                topic_data=(
                    m.TopicProduceData(
                        name=topic,
                        partition_data=(m.PartitionProduceData(index=partition, records=records),),
                    ),
                ),
            )
        )
        return response.responses[0].partition_responses[0]

    def close(self) -> None:
        self.client.close()


def comparable(value: Any, side: Side, name: str = "") -> Any:
    """`value` (a kio entity, or plain data holding them) as plain data, normalised."""
    if name in _NODE_FIELDS:
        return _node(value, side)
    if name == "error_message":
        return value if not value else "<message>"
    if name == "records":
        return _batches(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: comparable(getattr(value, f.name), side, f.name)
            for f in dataclasses.fields(value)
            if f.name not in _DROPPED
        }
    if isinstance(value, dict):
        return {k: comparable(v, side, k) for k, v in value.items() if k not in _DROPPED}
    if isinstance(value, (tuple, list)):
        return [comparable(v, side) for v in value]
    if isinstance(value, uuid.UUID):
        return "zero" if value.int == 0 else "id"
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _node(value: Any, side: Side) -> Any:
    if isinstance(value, (tuple, list)):
        return [_node(v, side) for v in value]
    return "self" if value == side.node_id else value


def _batches(records: bytes | None) -> list[tuple[int, int]] | None:
    """Fetched records as (base offset, record count) per batch."""
    if records is None:
        return None
    batches, _partial = split_batches(records)
    views = [BatchView(batch) for batch in batches]
    return [(view.base_offset, view.record_count) for view in views]


def differences(kafka: Any, ours: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, Apache Kafka's value, tierbroker's value) wherever the two differ."""
    if isinstance(kafka, dict) and isinstance(ours, dict):
        for key in sorted(kafka.keys() | ours.keys(), key=str):
            child = f"{path}.{key}" if path else str(key)
            yield from differences(kafka.get(key, "<absent>"), ours.get(key, "<absent>"), child)
    elif isinstance(kafka, list) and isinstance(ours, list) and len(kafka) == len(ours):
        for index, (k, o) in enumerate(zip(kafka, ours, strict=True)):
            yield from differences(k, o, f"{path}[{index}]")
    elif kafka != ours and not (path.endswith("error_message") and not kafka):
        # Message text is free; tierbroker may explain where Kafka does not.
        yield path, kafka, ours


def matches(path: str, pattern: str) -> bool:
    """`pattern` names `path`; `*` stands for any run of characters, all else is literal."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), path) is not None


def by_name(entries: Any) -> dict[str, Any]:
    """Entries that carry a `name` (configs, topics) keyed by it: order is not compared."""
    return {entry.name: entry for entry in entries}
