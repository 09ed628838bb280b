"""Remote log segment metadata and its state machine, as in KIP-405.

Segment states::

    COPY_SEGMENT_STARTED --> COPY_SEGMENT_FINISHED --> DELETE_SEGMENT_STARTED
              |                                              ^         |
              +----------------------------------------------+         v
                     (a failed or abandoned copy)           DELETE_SEGMENT_FINISHED

Repeating the current state is a no-op, so a retried update is safe; any other
transition raises. Only COPY_SEGMENT_FINISHED segments are read or counted in the
remote log size.
"""

from __future__ import annotations

import base64
import enum
import uuid
from dataclasses import dataclass, replace
from typing import Any

from tierbroker.storage.topic_partition import TopicPartition


class RemoteLogSegmentState(enum.IntEnum):
    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3

    def can_become(self, target: RemoteLogSegmentState) -> bool:
        return target == self or target in _SEGMENT_TRANSITIONS[self]


_SEGMENT_TRANSITIONS = {
    RemoteLogSegmentState.COPY_SEGMENT_STARTED: {
        RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
    },
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED: {RemoteLogSegmentState.DELETE_SEGMENT_STARTED},
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED: {RemoteLogSegmentState.DELETE_SEGMENT_FINISHED},
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED: set(),
}


class RemotePartitionDeleteState(enum.IntEnum):
    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


@dataclass(frozen=True, slots=True, order=True)
class TopicIdPartition:
    topic_id: uuid.UUID
    topic_partition: TopicPartition

    def __str__(self) -> str:
        return f"{self.topic_partition}:{self.topic_id}"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    @classmethod
    def generate(cls, tip: TopicIdPartition) -> RemoteLogSegmentId:
        return cls(tip, uuid.uuid4())


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteLogSegmentMetadata:
    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int  # inclusive
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_bytes: int
    segment_leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset), ascending
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    # KIP-1058: no aborted transaction's marker, so no transaction index, was uploaded
    # (False for segments copied before the field existed: their index is looked for).
    txn_index_empty: bool = False
    # KIP-917: what the storage plugin's copy returned, given back with every call about
    # the segment (None: it returned nothing, or the copy is not finished).
    custom_metadata: bytes | None = None

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.segment_id.topic_id_partition

    def with_state(
        self, state: RemoteLogSegmentState, event_timestamp_ms: int
    ) -> RemoteLogSegmentMetadata:
        if not self.state.can_become(state):
            raise ValueError(
                f"segment {self.segment_id.id}: {self.state.name} -> {state.name} is not allowed"
            )
        return replace(self, state=state, event_timestamp_ms=event_timestamp_ms)

    def to_json(self) -> dict[str, Any]:
        tip = self.topic_id_partition
        return {
            "topic": tip.topic_partition.topic,
            "partition": tip.topic_partition.partition,
            "topic_id": str(tip.topic_id),
            "segment_id": str(self.segment_id.id),
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "max_timestamp_ms": self.max_timestamp_ms,
            "broker_id": self.broker_id,
            "event_timestamp_ms": self.event_timestamp_ms,
            "segment_size_bytes": self.segment_size_bytes,
            "segment_leader_epochs": [list(e) for e in self.segment_leader_epochs],
            "state": self.state.name,
            "txn_index_empty": self.txn_index_empty,
            **(
                {}
                if self.custom_metadata is None
                else {"custom_metadata": base64.b64encode(self.custom_metadata).decode()}
            ),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RemoteLogSegmentMetadata:
        tip = TopicIdPartition(
            uuid.UUID(data["topic_id"]), TopicPartition(data["topic"], data["partition"])
        )
        return cls(
            segment_id=RemoteLogSegmentId(tip, uuid.UUID(data["segment_id"])),
            start_offset=data["start_offset"],
            end_offset=data["end_offset"],
            max_timestamp_ms=data["max_timestamp_ms"],
            broker_id=data["broker_id"],
            event_timestamp_ms=data["event_timestamp_ms"],
            segment_size_bytes=data["segment_size_bytes"],
            segment_leader_epochs=tuple((e, o) for e, o in data["segment_leader_epochs"]),
            state=RemoteLogSegmentState[data["state"]],
            txn_index_empty=data.get("txn_index_empty", False),
            custom_metadata=(
                None if "custom_metadata" not in data else base64.b64decode(data["custom_metadata"])
            ),
        )
