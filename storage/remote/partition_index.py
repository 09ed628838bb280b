"""`PartitionIndex`: what a partition's prefix in the remote tier says of its topic, beside
the segment manifests, so the topic can be rebuilt from the bucket alone.

    <partition prefix>partition.json

(see `ObjectKeyLayout.partition_index_key`) is one small JSON document::

    {"version": 1, "topic": ..., "topic_id": <Kafka's base64 id>, "partition": 0,
     "partition_count": 3, "configs": {<the topic's config overrides>},
     "log_start_offset": 120, "leader_epoch": 4, "broker_id": 1}

The manifests stay the truth of which segments exist: the index names none of them.
It holds what no manifest can: the topic's partition count and config overrides as
its leader knew them, the log start offset (DeleteRecords and retention move it past
segments that exist until expiration deletes them) and the leader epoch the leader
wrote it in. The partition's leader writes it (`rlm.partition_index_writer`) in one
atomic write (one PUT, or a temporary file renamed), only when its content changes,
so it costs no request per copy; it may lag the log start offset by one run of the
copy task. Deleting the partition's remote data deletes it last.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tierbroker.storage.checkpoints import kafka_uuid, parse_kafka_uuid
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.topic_partition import TopicPartition

PARTITION_INDEX_NAME = "partition.json"
PARTITION_INDEX_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicDescription:
    """A topic as the broker's metadata has it: partition count and config overrides."""

    partition_count: int
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionIndex:
    tip: TopicIdPartition
    topic: TopicDescription
    log_start_offset: int
    leader_epoch: int
    broker_id: int

    def to_json(self) -> bytes:
        tp = self.tip.topic_partition
        document: dict[str, Any] = {
            "version": PARTITION_INDEX_VERSION,
            "topic": tp.topic,
            "topic_id": kafka_uuid(self.tip.topic_id),
            "partition": tp.partition,
            "partition_count": self.topic.partition_count,
            "configs": dict(sorted(self.topic.configs.items())),
            "log_start_offset": self.log_start_offset,
            "leader_epoch": self.leader_epoch,
            "broker_id": self.broker_id,
        }
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> PartitionIndex:
        """Parse an index; ValueError naming `source` (its key) if it is not one."""
        try:
            document = json.loads(data)
            if document.get("version") != PARTITION_INDEX_VERSION:
                raise ValueError(f"unknown version {document.get('version')!r}")
            configs = document["configs"]
            if not isinstance(configs, dict):
                raise ValueError("configs is not an object")
            return cls(
                tip=TopicIdPartition(
                    parse_kafka_uuid(str(document["topic_id"])),
                    TopicPartition(str(document["topic"]), int(document["partition"])),
                ),
                topic=TopicDescription(
                    partition_count=int(document["partition_count"]),
                    configs={str(k): str(v) for k, v in configs.items()},
                ),
                log_start_offset=int(document["log_start_offset"]),
                leader_epoch=int(document["leader_epoch"]),
                broker_id=int(document["broker_id"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{source}: not a partition index ({e})") from None
