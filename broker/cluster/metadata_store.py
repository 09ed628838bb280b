"""`MetadataStore`: the durable record of topics, their ids, partition counts and configs.

`LocalMetadataStore` keeps it in one JSON file in the first log dir, rewritten
atomically on each change, so topic ids and configs survive restarts and a topic
deleted while the broker was down has its logs removed on the next start. Not
shared between tasks: the controller serialises changes.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from tierbroker.storage.checkpoints import write_atomically

METADATA_FILE = "cluster-metadata.json"


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: uuid.UUID
    partitions: int
    replication_factor: int = 1
    configs: dict[str, str] = field(default_factory=dict)  # overrides, Kafka names

    def with_changes(self, **changes: object) -> TopicRecord:
        return replace(self, **changes)  # type: ignore[arg-type]


class LocalMetadataStore:
    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / METADATA_FILE
        self.cluster_id: str = ""
        self.producer_id_block_end = 0  # ids below this may have been handed out
        self.topics: dict[str, TopicRecord] = {}
        self._names_by_id: dict[uuid.UUID, str] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            self.cluster_id = _new_cluster_id()
            self._save()
            return
        data = json.loads(self.path.read_text(encoding="utf-8"))
        self.cluster_id = data["cluster_id"]
        self.producer_id_block_end = data.get("producer_id_block_end", 0)
        for t in data["topics"]:
            record = TopicRecord(
                t["name"],
                uuid.UUID(t["topic_id"]),
                t["partitions"],
                t["replication_factor"],
                dict(t["configs"]),
            )
            self.topics[record.name] = record
            self._names_by_id[record.topic_id] = record.name

    def _save(self) -> None:
        data = {
            "cluster_id": self.cluster_id,
            "producer_id_block_end": self.producer_id_block_end,
            "topics": [
                {
                    "name": t.name,
                    "topic_id": str(t.topic_id),
                    "partitions": t.partitions,
                    "replication_factor": t.replication_factor,
                    "configs": t.configs,
                }
                for t in self.topics.values()
            ],
        }
        write_atomically(self.path, json.dumps(data, indent=1, sort_keys=True))

    def put(self, topic: TopicRecord) -> None:
        """Add or replace the topic; if the write fails (OSError) nothing changed."""
        previous = self.topics.get(topic.name)
        self._remember(topic)
        try:
            self._save()
        except OSError:
            self._forget(topic)
            if previous is not None:
                self._remember(previous)
            raise

    def _remember(self, topic: TopicRecord) -> None:
        self.topics[topic.name] = topic
        self._names_by_id[topic.topic_id] = topic.name

    def _forget(self, topic: TopicRecord) -> None:
        del self.topics[topic.name]
        del self._names_by_id[topic.topic_id]

    def remove(self, name: str) -> None:
        """Forget the topic; if the write fails (OSError) it is still known, as on disk."""
        removed = self.topics.get(name)
        if removed is not None:
            self._forget(removed)
            try:
                self._save()
            except OSError:
                self._remember(removed)
                raise

    def allocate_producer_id_block(self, size: int) -> int:
        """Reserve `size` producer ids durably; returns the first of them."""
        start = self.producer_id_block_end
        self.producer_id_block_end += size
        try:
            self._save()
        except OSError:
            self.producer_id_block_end = start
            raise
        return start

    def by_id(self, topic_id: uuid.UUID) -> TopicRecord | None:
        name = self._names_by_id.get(topic_id)
        return self.topics[name] if name is not None else None


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
